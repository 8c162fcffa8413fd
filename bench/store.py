"""Store benchmark: fenced event appends against raw driver inserts, on SQLite and PostgreSQL.

Run from the project root: ``.venv/bin/python bench/store.py`` (or ``make bench``).

For each database, on the same machine in one run, it measures:

1. fenced single-event appends: one ``claims.fenced`` transaction per ``TextDelta``;
2. raw single-row transactional inserts with the bare driver (``sqlite3`` with the store's
   pragmas and ``BEGIN IMMEDIATE``; sync ``psycopg``), into a table with the ``event`` table's
   columns, primary key, unique constraint and index;
3. batched appends: ``publish_many`` of N deltas per fenced transaction, against raw
   ``executemany`` of N rows in one transaction;

and prints events per second with the ratios store/raw against the targets (fenced >= 40 % of
raw single-row, batched >= 50 % of raw batched). Raw async psycopg is printed for information.

PostgreSQL: ``SESSIONFLOW_BENCH_POSTGRES_URL`` (default
``postgresql+psycopg://root@127.0.0.1:5432/test``); the run creates a fresh schema and drops it
at the end, and skips PostgreSQL with a note when the server cannot be reached.
SQLite: a temporary directory, removed at the end.
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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's directory comes first on sys.path, where this very file would
# shadow the ``store`` package: put the project root there instead.
_BENCH_DIR = Path(__file__).resolve().parent
_ROOT = _BENCH_DIR.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_ROOT))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.dialects import postgresql as pg_dialect  # noqa: E402
from sqlalchemy.dialects import sqlite as sqlite_dialect  # noqa: E402
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
LEASE_MS = 600_000


# --- measurement ---------------------------------------------------------------------------------


@dataclass
class Rate:
    """One measurement: ``ops`` transactions carrying ``events`` events in ``seconds``."""

    name: str
    ops: int = 0
    events: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def latency_ms(self, quantile: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))] * 1000


@dataclass(frozen=True)
class Budget:
    """How long each measurement runs, after its warm-up."""

    seconds: float
    warmup: float
    batch: int


def measure_sync(name: str, budget: Budget, per_op: int, op: Callable[[], None]) -> Rate:
    _run_sync(budget.warmup, op, None)
    rate = Rate(name)
    _run_sync(budget.seconds, op, rate)
    rate.events = rate.ops * per_op
    return rate


def _run_sync(seconds: float, op: Callable[[], None], rate: Rate | None) -> None:
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    now = start
    while now < deadline:
        op()
        after = clock()
        if rate is not None:
            rate.ops += 1
            rate.latencies.append(after - now)
        now = after
    if rate is not None:
        rate.seconds = now - start


async def measure_async(
    name: str, budget: Budget, per_op: int, op: Callable[[], Awaitable[None]]
) -> Rate:
    await _run_async(budget.warmup, op, None)
    rate = Rate(name)
    await _run_async(budget.seconds, op, rate)
    rate.events = rate.ops * per_op
    return rate


async def _run_async(seconds: float, op: Callable[[], Awaitable[None]], rate: Rate | None) -> None:
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    now = start
    while now < deadline:
        await op()
        after = clock()
        if rate is not None:
            rate.ops += 1
            rate.latencies.append(after - now)
        now = after
    if rate is not None:
        rate.seconds = now - start


# --- the store path -------------------------------------------------------------------------------


@dataclass
class StoreTarget:
    store: Store
    claim: Claim
    session_id: str
    message_id: str = "msg_bench"


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


def delta(target: StoreTarget) -> ev.TextDelta:
    return ev.TextDelta(
        session_id=target.session_id,
        assistant_message_id=target.message_id,
        ordinal=0,
        delta=DELTA,
    )


async def bench_fenced_single(target: StoreTarget, budget: Budget, label: str) -> Rate:
    store, claim = target.store, target.claim

    async def op() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(delta(target), tx=tx)

    return await measure_async(f"{label} fenced publish x1", budget, 1, op)


async def bench_fenced_batched(target: StoreTarget, budget: Budget, label: str) -> Rate:
    store, claim, n = target.store, target.claim, budget.batch

    async def op() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish_many([delta(target) for _ in range(n)], tx=tx)

    return await measure_async(f"{label} fenced publish_many x{n}", budget, n, op)


# --- the raw drivers ------------------------------------------------------------------------------


def raw_table() -> sa.Table:
    """A table with the ``event`` table's columns, key, unique constraint and index (no FK)."""
    metadata = sa.MetaData()
    columns = [
        sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable)
        for c in event_table.columns
    ]
    return sa.Table(
        RAW_TABLE,
        metadata,
        *columns,
        sa.UniqueConstraint("aggregate_id", "seq"),
        sa.Index(f"ix_{RAW_TABLE}_aggregate_id_type_seq", "aggregate_id", "type", "seq"),
    )


def raw_ddl(dialect: sa.Dialect) -> list[str]:
    table = raw_table()
    statements = [str(sa.schema.CreateTable(table).compile(dialect=dialect))]
    statements += [str(sa.schema.CreateIndex(ix).compile(dialect=dialect)) for ix in table.indexes]
    return statements


COLUMNS = [c.name for c in event_table.columns]


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


def sqlite_insert_sql() -> str:
    names = ", ".join(COLUMNS)
    params = ", ".join(f":{name}" for name in COLUMNS)
    return f"INSERT INTO {RAW_TABLE} ({names}) VALUES ({params})"


def pg_insert_sql() -> str:
    names = ", ".join(COLUMNS)
    params = ", ".join(f"%({name})s" for name in COLUMNS)
    return f"INSERT INTO {RAW_TABLE} ({names}) VALUES ({params})"


def open_raw_sqlite(path: Path) -> sqlite3.Connection:
    """A bare sqlite3 connection with the store's pragmas; transactions are explicit."""
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in (
        "PRAGMA journal_mode=WAL",
        f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
        "PRAGMA foreign_keys=ON",
        "PRAGMA synchronous=FULL",
    ):
        conn.execute(pragma)
    for statement in raw_ddl(sqlite_dialect.dialect()):
        conn.execute(statement)
    return conn


def bench_raw_sqlite(path: Path, budget: Budget) -> tuple[Rate, Rate]:
    conn = open_raw_sqlite(path)
    rows = RawRows("ses_raw")
    sql = sqlite_insert_sql()
    n = budget.batch

    def single() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sql, rows.next())
        conn.execute("COMMIT")

    def batched() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows.batch(n))
        conn.execute("COMMIT")

    try:
        return (
            measure_sync("SQLite raw sqlite3 x1", budget, 1, single),
            measure_sync(f"SQLite raw sqlite3 executemany x{n}", budget, n, batched),
        )
    finally:
        conn.close()


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def bench_raw_pg(conninfo: str, schema: str, budget: Budget) -> tuple[Rate, Rate]:
    options = f"-csearch_path={schema}"
    with psycopg.connect(conninfo, options=options, autocommit=True) as setup:
        for statement in raw_ddl(pg_dialect.dialect()):
            setup.execute(statement)
    rows = RawRows("ses_raw")
    sql = pg_insert_sql()
    n = budget.batch
    with psycopg.connect(conninfo, options=options) as conn:

        def single() -> None:
            conn.execute(sql, rows.next())
            conn.commit()

        def batched() -> None:
            with conn.cursor() as cursor:
                cursor.executemany(sql, rows.batch(n))
            conn.commit()

        return (
            measure_sync("PostgreSQL raw psycopg x1", budget, 1, single),
            measure_sync(f"PostgreSQL raw psycopg executemany x{n}", budget, n, batched),
        )


async def bench_raw_pg_async(conninfo: str, schema: str, budget: Budget) -> Rate:
    rows = RawRows("ses_raw_async")
    sql = pg_insert_sql()
    conn = await psycopg.AsyncConnection.connect(conninfo, options=f"-csearch_path={schema}")
    try:

        async def single() -> None:
            await conn.execute(sql, rows.next())
            await conn.commit()

        return await measure_async("PostgreSQL raw async psycopg x1", budget, 1, single)
    finally:
        await conn.close()


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


async def bench_sqlite(directory: Path, budget: Budget) -> tuple[list[Comparison], list[Rate]]:
    url = f"sqlite+aiosqlite:///{directory / 'store.db'}"
    target = await open_target(url, None)
    try:
        fenced = await bench_fenced_single(target, budget, "SQLite")
        batched = await bench_fenced_batched(target, budget, "SQLite")
    finally:
        await target.store.close()
    raw_single, raw_batched = bench_raw_sqlite(directory / "raw.db", budget)
    comparisons = [
        Comparison("SQLite", "fenced x1 / raw x1", fenced, raw_single, FENCED_TARGET),
        Comparison(
            "SQLite",
            f"batched x{budget.batch} / raw x{budget.batch}",
            batched,
            raw_batched,
            BATCHED_TARGET,
        ),
    ]
    return comparisons, [fenced, raw_single, batched, raw_batched]


def postgres_reachable(conninfo: str) -> str | None:
    """None when the server answers, else why not."""
    try:
        with psycopg.connect(conninfo, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        return str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    return None


def drop_schema(conninfo: str, schema: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def bench_postgres(url: str, budget: Budget) -> tuple[list[Comparison], list[Rate]]:
    conninfo = libpq(url)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    try:
        target = await open_target(url, schema)
        try:
            fenced = await bench_fenced_single(target, budget, "PostgreSQL")
            batched = await bench_fenced_batched(target, budget, "PostgreSQL")
        finally:
            await target.store.close()
        raw_single, raw_batched = bench_raw_pg(conninfo, schema, budget)
        raw_async = await bench_raw_pg_async(conninfo, schema, budget)
    finally:
        drop_schema(conninfo, schema)
    comparisons = [
        Comparison("PostgreSQL", "fenced x1 / raw x1", fenced, raw_single, FENCED_TARGET),
        Comparison(
            "PostgreSQL",
            f"batched x{budget.batch} / raw x{budget.batch}",
            batched,
            raw_batched,
            BATCHED_TARGET,
        ),
    ]
    return comparisons, [fenced, raw_single, raw_async, batched, raw_batched]


# --- report ---------------------------------------------------------------------------------------


def print_rates(rates: list[Rate]) -> None:
    print(f"{'measurement':<44} {'events/s':>10} {'txn/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for rate in rates:
        print(
            f"{rate.name:<44} {rate.per_second:>10,.0f} {rate.ops / rate.seconds:>9,.0f} "
            f"{rate.latency_ms(0.5):>8.3f} {rate.latency_ms(0.99):>8.3f}"
        )


def print_comparisons(comparisons: list[Comparison]) -> None:
    header = (
        f"{'database':<11} {'comparison':<24} {'store ev/s':>11} {'raw ev/s':>11} "
        f"{'ratio':>7} {'target':>7}  result"
    )
    print(header)
    print("-" * len(header))
    for c in comparisons:
        print(
            f"{c.database:<11} {c.what:<24} {c.store.per_second:>11,.0f} "
            f"{c.raw.per_second:>11,.0f} {c.ratio:>6.0%} {'>=' + format(c.target, '.0%'):>7}  "
            f"{'PASS' if c.passed else 'MISS'}"
        )


def environment() -> Iterator[str]:
    yield f"python {sys.version.split()[0]}, sqlalchemy {sa.__version__}"
    yield f"psycopg {psycopg.__version__}, sqlite {sqlite3.sqlite_version}, cpus {os.cpu_count()}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=2.5, help="per measurement")
    parser.add_argument("--warmup", type=float, default=0.3, help="per measurement")
    parser.add_argument("--batch", type=int, default=100, help="events per batched transaction")
    args = parser.parse_args()
    budget = Budget(seconds=args.seconds, warmup=args.warmup, batch=args.batch)
    url = os.environ.get("SESSIONFLOW_BENCH_POSTGRES_URL") or DEFAULT_POSTGRES_URL

    started = time.perf_counter()
    for line in environment():
        print(line)
    print(f"{budget.seconds:g} s per measurement after {budget.warmup:g} s warm-up\n")

    comparisons: list[Comparison] = []
    rates: list[Rate] = []
    with tempfile.TemporaryDirectory(prefix="sessionflow-bench-") as directory:
        print(f"SQLite: {directory}")
        found, measured = await bench_sqlite(Path(directory), budget)
        comparisons += found
        rates += measured

    shown = make_url(url).render_as_string(hide_password=True)
    why = postgres_reachable(libpq(url))
    if why is None:
        print(f"PostgreSQL: {shown}")
        found, measured = await bench_postgres(url, budget)
        comparisons += found
        rates += measured
    else:
        print(f"PostgreSQL: skipped, {shown} is unreachable ({why})")

    print()
    print_rates(rates)
    print()
    print_comparisons(comparisons)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
