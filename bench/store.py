"""Store benchmark: fenced event appends against raw driver inserts, on SQLite and PostgreSQL.

Run from the project root: ``.venv/bin/python bench/store.py`` (or ``make bench``).

For each database, on the same machine in one run, it measures:

1. fenced single-event appends: one ``Store.append`` (a fenced transaction) per ``TextDelta``,
   the path a turn's token deltas take;
2. raw single-row transactional inserts with the bare driver (``sqlite3`` with the store's
   pragmas and ``BEGIN IMMEDIATE ... COMMIT``; sync ``psycopg``, one transaction per row), into
   a table with the ``event`` table's columns, primary key, unique constraint and index;
3. batched appends: ``Store.append`` of N deltas per fenced transaction, against raw
   ``executemany`` of N rows in one transaction;
4. for information, the general path (``claims.fenced`` + ``publish``/``publish_many``) that
   events with projections take;

and prints events per second with the ratios store/raw against the targets (fenced >= 40 % of
raw single-row, batched >= 50 % of raw batched). Raw async psycopg is shown for information.

Each measurement runs for a fixed time after a warm-up, split into rounds that alternate between
the store and the raw driver, so background work (checkpoints, WAL flushes) hits both sides.

PostgreSQL: ``SESSIONFLOW_BENCH_POSTGRES_URL`` (default
``postgresql+psycopg://root@127.0.0.1:5432/test``); the run creates a fresh schema and drops it
at the end, and skips PostgreSQL with a note when the server cannot be reached.
SQLite: files in a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's directory comes first on sys.path, where this very file would
# shadow the ``store`` package: put the project root there instead.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from sessionflow.models import events as ev  # noqa: E402
from sessionflow.settings import Settings  # noqa: E402
from store import Store, codec, open_store  # noqa: E402
from store.claims import Claim  # noqa: E402
from store.db import SQLITE_BUSY_TIMEOUT_MS  # noqa: E402
from store.schema import event_table  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
RAW_TABLE = "raw_event"
FENCED_TARGET = 0.40
BATCHED_TARGET = 0.50
DELTA = "x" * 32
# Long enough that the claim never expires while the raw measurements run between rounds.
LEASE_MS = 600_000


# --- measurement ----------------------------------------------------------------------------------


@dataclass
class Rate:
    """One measurement: ``ops`` transactions of ``per_op`` events each, in ``seconds``."""

    name: str
    per_op: int
    ops: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.ops * self.per_op

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def txn_per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    def latency_ms(self, quantile: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] * 1000


Runner = Callable[[float, Rate | None], Awaitable[None]]


@dataclass
class Case:
    """A measured operation: ``run(seconds, rate)`` repeats it for ``seconds`` (into ``rate``)."""

    rate: Rate
    run: Runner


@dataclass(frozen=True)
class Budget:
    seconds: float  # per measurement, summed over its rounds
    warmup: float  # per measurement, before its first round
    rounds: int
    batch: int


def sync_case(name: str, per_op: int, op: Callable[[], None]) -> Case:
    async def run(seconds: float, rate: Rate | None) -> None:
        clock = time.perf_counter
        start = now = clock()
        deadline = start + seconds
        while now < deadline:
            op()
            after = clock()
            if rate is not None:
                rate.ops += 1
                rate.latencies.append(after - now)
            now = after
        if rate is not None:
            rate.seconds += now - start

    return Case(Rate(name, per_op), run)


def async_case(name: str, per_op: int, op: Callable[[], Awaitable[None]]) -> Case:
    async def run(seconds: float, rate: Rate | None) -> None:
        clock = time.perf_counter
        start = now = clock()
        deadline = start + seconds
        while now < deadline:
            await op()
            after = clock()
            if rate is not None:
                rate.ops += 1
                rate.latencies.append(after - now)
            now = after
        if rate is not None:
            rate.seconds += now - start

    return Case(Rate(name, per_op), run)


async def measure(cases: Sequence[Case], budget: Budget) -> list[Rate]:
    """Warm every case up, then run them in alternating rounds."""
    for case in cases:
        await case.run(budget.warmup, None)
    for _ in range(budget.rounds):
        for case in cases:
            await case.run(budget.seconds / budget.rounds, case.rate)
    return [case.rate for case in cases]


# --- the store path -------------------------------------------------------------------------------


@dataclass
class StoreTarget:
    store: Store
    claim: Claim
    session_id: str
    message_id: str = "msg_bench"

    def delta(self) -> ev.TextDelta:
        return ev.TextDelta(
            session_id=self.session_id,
            assistant_message_id=self.message_id,
            ordinal=0,
            delta=DELTA,
        )


async def open_target(url: str, schema: str | None) -> StoreTarget:
    settings = Settings(database_url=url, lease_ms=LEASE_MS)
    store = await open_store(url, schema=schema, settings=settings)
    try:
        info = await store.sessions.create("/tmp/bench", title="bench")
        claim = await store.claims.acquire(info.id, f"exe_{uuid.uuid4().hex[:16]}", "bench")
    except BaseException:
        await store.close()
        raise
    return StoreTarget(store, claim, info.id)


def store_cases(target: StoreTarget, label: str, batch: int) -> tuple[Case, Case]:
    store, claim = target.store, target.claim

    async def single() -> None:
        await store.append(claim, [target.delta()])

    async def batched() -> None:
        await store.append(claim, [target.delta() for _ in range(batch)])

    return (
        async_case(f"{label} fenced append x1", 1, single),
        async_case(f"{label} fenced append x{batch}", batch, batched),
    )


def general_cases(target: StoreTarget, label: str, batch: int) -> tuple[Case, Case]:
    """The general path (``claims.fenced`` + ``publish_many``), which projected events take."""
    store, claim = target.store, target.claim

    async def single() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(target.delta(), tx=tx)

    async def batched() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish_many([target.delta() for _ in range(batch)], tx=tx)

    return (
        async_case(f"{label} fenced publish x1 (info)", 1, single),
        async_case(f"{label} fenced publish_many x{batch} (info)", batch, batched),
    )


# --- the raw drivers ------------------------------------------------------------------------------

COLUMNS = [column.name for column in event_table.columns]


def raw_ddl(dialect: sa.Dialect) -> list[str]:
    """DDL of a table with the ``event`` table's columns, key, unique constraint and index.

    No foreign key: the raw path has no ``event_sequence`` row to point at.
    """
    table = sa.Table(
        RAW_TABLE,
        sa.MetaData(),
        *(
            sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
            for c in event_table.columns
        ),
        sa.UniqueConstraint("aggregate_id", "seq"),
        sa.Index(f"ix_{RAW_TABLE}_aggregate_id_type_seq", "aggregate_id", "type", "seq"),
    )
    statements = [str(sa.schema.CreateTable(table).compile(dialect=dialect))]
    statements += [str(sa.schema.CreateIndex(ix).compile(dialect=dialect)) for ix in table.indexes]
    return statements


class RawRows:
    """Rows shaped like the store's: a fresh id and the next seq each, the same payload."""

    def __init__(self, aggregate_id: str) -> None:
        self.aggregate_id = aggregate_id
        self.seq = 0
        self.prefix = f"evt_raw{uuid.uuid4().hex[:8]}_"
        payload = ev.TextDelta(
            session_id=aggregate_id, assistant_message_id="msg_bench", ordinal=0, delta=DELTA
        )
        self.type = payload.stored_type()
        self.data = codec.dumps(payload.model_dump(mode="json"))

    def next(self) -> dict[str, Any]:
        self.seq += 1
        return {
            "id": f"{self.prefix}{self.seq}",
            "aggregate_id": self.aggregate_id,
            "seq": self.seq,
            "created": int(time.time() * 1000),
            "type": self.type,
            "data": self.data,
            "execution_id": "exe_raw",
            "epoch": 1,
        }

    def batch(self, n: int) -> list[dict[str, Any]]:
        return [self.next() for _ in range(n)]


def insert_sql(placeholder: Callable[[str], str]) -> str:
    names = ", ".join(COLUMNS)
    values = ", ".join(placeholder(name) for name in COLUMNS)
    return f"INSERT INTO {RAW_TABLE} ({names}) VALUES ({values})"


def open_raw_sqlite(path: Path, dialect: sa.Dialect) -> sqlite3.Connection:
    """A bare sqlite3 connection with the store's pragmas; transactions are explicit."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in (
        "PRAGMA journal_mode=WAL",
        f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
        "PRAGMA foreign_keys=ON",
        "PRAGMA synchronous=FULL",
    ):
        conn.execute(pragma)
    for statement in raw_ddl(dialect):
        conn.execute(statement)
    return conn


def raw_sqlite_cases(conn: sqlite3.Connection, batch: int) -> tuple[Case, Case]:
    rows = RawRows("ses_raw")
    sql = insert_sql(lambda name: f":{name}")

    def single() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, rows.next())
        conn.execute("COMMIT")

    def batched() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows.batch(batch))
        conn.execute("COMMIT")

    return (
        sync_case("SQLite raw sqlite3 x1", 1, single),
        sync_case(f"SQLite raw sqlite3 executemany x{batch}", batch, batched),
    )


def raw_pg_cases(conn: psycopg.Connection[Any], batch: int) -> tuple[Case, Case]:
    rows = RawRows("ses_raw")
    sql = insert_sql(lambda name: f"%({name})s")

    def single() -> None:
        conn.execute(sql, rows.next())
        conn.commit()

    def batched() -> None:
        with conn.cursor() as cursor:
            cursor.executemany(sql, rows.batch(batch))
        conn.commit()

    return (
        sync_case("PostgreSQL raw psycopg x1", 1, single),
        sync_case(f"PostgreSQL raw psycopg executemany x{batch}", batch, batched),
    )


def raw_pg_async_case(conn: psycopg.AsyncConnection[Any]) -> Case:
    rows = RawRows("ses_raw_async")
    sql = insert_sql(lambda name: f"%({name})s")

    async def single() -> None:
        await conn.execute(sql, rows.next())
        await conn.commit()

    return async_case("PostgreSQL raw async psycopg x1 (info)", 1, single)


# --- per database ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    database: str
    what: str
    store: Rate
    raw: Rate
    target: float

    @property
    def ratio(self) -> float:
        return self.store.per_second / self.raw.per_second if self.raw.per_second else 0.0

    @property
    def passed(self) -> bool:
        return self.ratio >= self.target


def compare(database: str, rates: Sequence[Rate], batch: int) -> list[Comparison]:
    """``rates`` in the order fenced, raw single, fenced batched, raw batched."""
    fenced, raw_single, batched, raw_batched = rates
    return [
        Comparison(database, "fenced x1 / raw x1", fenced, raw_single, FENCED_TARGET),
        Comparison(
            database, f"batch x{batch} / raw x{batch}", batched, raw_batched, BATCHED_TARGET
        ),
    ]


async def bench_sqlite(directory: Path, budget: Budget) -> tuple[list[Comparison], list[Rate]]:
    target = await open_target(f"sqlite+aiosqlite:///{directory / 'store.db'}", None)
    try:
        with closing(
            open_raw_sqlite(directory / "raw.db", target.store.db.write_engine.dialect)
        ) as conn:
            fenced, batched = store_cases(target, "SQLite", budget.batch)
            raw_single, raw_batched = raw_sqlite_cases(conn, budget.batch)
            general = general_cases(target, "SQLite", budget.batch)
            rates = await measure([fenced, raw_single, batched, raw_batched, *general], budget)
    finally:
        await target.store.close()
    return compare("SQLite", rates[:4], budget.batch), rates


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_unreachable(conninfo: str) -> str | None:
    """None when the server answers, else why not."""
    try:
        with psycopg.connect(conninfo, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return (str(error).strip().splitlines() or [repr(error)])[0]
    return None


def drop_schema(conninfo: str, schema: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def bench_postgres(url: str, budget: Budget) -> tuple[list[Comparison], list[Rate]]:
    conninfo = libpq(url)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    options = f"-csearch_path={schema}"
    try:
        async with AsyncExitStack() as stack:
            target = await open_target(url, schema)  # creates the schema
            stack.push_async_callback(target.store.close)
            with psycopg.connect(conninfo, options=options, autocommit=True) as setup:
                for statement in raw_ddl(target.store.db.write_engine.dialect):
                    setup.execute(statement)
            conn = stack.enter_context(psycopg.connect(conninfo, options=options))
            aconn = await psycopg.AsyncConnection.connect(conninfo, options=options)
            await stack.enter_async_context(aconn)
            fenced, batched = store_cases(target, "PostgreSQL", budget.batch)
            raw_single, raw_batched = raw_pg_cases(conn, budget.batch)
            raw_async = raw_pg_async_case(aconn)
            general = general_cases(target, "PostgreSQL", budget.batch)
            cases = [fenced, raw_single, raw_async, batched, raw_batched, *general]
            rates = await measure(cases, budget)
    finally:
        drop_schema(conninfo, schema)
    compared = [rates[0], rates[1], rates[3], rates[4]]
    return compare("PostgreSQL", compared, budget.batch), rates


# --- report ---------------------------------------------------------------------------------------


def print_rates(rates: Sequence[Rate]) -> None:
    print(f"{'measurement':<44} {'events/s':>10} {'txn/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for rate in rates:
        print(
            f"{rate.name:<44} {rate.per_second:>10,.0f} {rate.txn_per_second:>8,.0f} "
            f"{rate.latency_ms(0.5):>8.3f} {rate.latency_ms(0.99):>8.3f}"
        )


def print_comparisons(comparisons: Sequence[Comparison]) -> None:
    header = (
        f"{'database':<11} {'store / raw':<24} {'store ev/s':>11} {'raw ev/s':>11} "
        f"{'ratio':>6} {'target':>7}  result"
    )
    print(header)
    print("-" * len(header))
    for c in comparisons:
        target = f">={c.target:.0%}"
        print(
            f"{c.database:<11} {c.what:<24} {c.store.per_second:>11,.0f} "
            f"{c.raw.per_second:>11,.0f} {c.ratio:>6.0%} {target:>7}  "
            f"{'PASS' if c.passed else 'MISS'}"
        )


def parse_budget(argv: Sequence[str] | None = None) -> Budget:
    parser = argparse.ArgumentParser(description="Fenced store appends vs raw driver inserts.")
    parser.add_argument("--seconds", type=float, default=2.4, help="per measurement (total)")
    parser.add_argument("--warmup", type=float, default=0.3, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--batch", type=int, default=100, help="events per batched transaction")
    args = parser.parse_args(argv)
    return Budget(args.seconds, args.warmup, max(1, args.rounds), max(1, args.batch))


async def main() -> None:
    budget = parse_budget()
    url = os.environ.get("SESSIONFLOW_BENCH_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    started = time.perf_counter()
    print(
        f"python {sys.version.split()[0]}, sqlalchemy {sa.__version__}, "
        f"psycopg {psycopg.__version__}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} cpus"
    )
    print(
        f"{budget.seconds:g} s per measurement in {budget.rounds} alternating rounds, "
        f"after {budget.warmup:g} s warm-up; batches of {budget.batch}"
    )

    comparisons: list[Comparison] = []
    rates: list[Rate] = []
    with tempfile.TemporaryDirectory(prefix="sessionflow-bench-") as directory:
        print(f"SQLite: files in {directory}")
        found, measured = await bench_sqlite(Path(directory), budget)
        comparisons += found
        rates += measured

    shown = make_url(url).render_as_string(hide_password=True)
    why = postgres_unreachable(libpq(url))
    if why is None:
        print(f"PostgreSQL: {shown} (fresh schema, dropped at the end)")
        found, measured = await bench_postgres(url, budget)
        comparisons += found
        rates += measured
    else:
        print(f"PostgreSQL: SKIPPED, {shown} is unreachable: {why}")

    print()
    print_rates(rates)
    print()
    print_comparisons(comparisons)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
