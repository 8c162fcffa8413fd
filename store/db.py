"""Engines, transactions and migrations.

SQLite: WAL, ``BEGIN IMMEDIATE`` for every write transaction (a deferred transaction that
upgrades to a write gets SQLITE_BUSY at once, ignoring busy_timeout), a busy timeout of several
seconds, and one writer connection per process through which that process's writes are
serialized (several writers racing on one file starve each other for seconds).
PostgreSQL: one pool (``Pools``), and a small one of its own for claim renewals, so that a
renewal never waits behind the checkouts of a worker's other activities; fenced transactions lock
the claim row. A checkout costs no round trip: a connection the server closed while it sat idle
is told apart by its socket, as ``store.write.fast`` does, instead of a pre-ping. A read of one
statement runs without a transaction (no BEGIN, no COMMIT). Every connection is pinned to
READ COMMITTED and bounded in how long it may wait (``Waits``), whatever the server's defaults.

A write commits and announces (runs its after-commit callbacks) as one unit, still holding this
process's write lock: a write cancelled at its commit has committed and been announced, or has
not committed. The database's own refusals surface as the store's typed errors
(``dialect.store_error``); ``transact`` runs a write again after a serialization failure or a
deadlock.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from sessionflow.errors import StoreOpenError, StoreUnavailableError, TransactionConflictError
from store.dialect import (
    DRIVER_ERRORS,
    DialectName,
    Waits,
    dialect_of,
    postgres_options,
    sqlstate,
    store_error,
    typed_errors,
)

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 10_000
# The WAL file's size once a checkpoint has caught up (catalogue S11). A reader holding an old
# snapshot stops checkpoints short, and the WAL grows meanwhile; once it lets go, the next reset
# of the log truncates the file back to this, instead of leaving it at its largest for good.
SQLITE_WAL_LIMIT_BYTES = 64 * 1024 * 1024


def sqlite_pragmas(busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> tuple[str, ...]:
    """Every SQLite connection of the store runs these (the SQLAlchemy pools and the hot
    path's own connections alike). WAL lets readers run beside the one writer;
    ``synchronous=FULL`` makes every acknowledged commit survive power loss."""
    return (
        "PRAGMA journal_mode=WAL",
        f"PRAGMA busy_timeout={busy_timeout_ms}",
        "PRAGMA foreign_keys=ON",
        "PRAGMA synchronous=FULL",
        f"PRAGMA journal_size_limit={SQLITE_WAL_LIMIT_BYTES}",
    )


MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = 0x5E55_F10
# A migration may wait for another process's and run DDL for longer than the lease bounds
# everything else by; it runs once, when the store opens, under no claim.
MIGRATION_STATEMENT_TIMEOUT_MS = 300_000
DEFAULT_LEASE_MS = 30_000
CONFLICT_ATTEMPTS = 5


@dataclass(frozen=True)
class Stamp:
    """The claim a fenced transaction runs under; stamped on every event it writes."""

    execution_id: str
    epoch: int


class Connection(Protocol):
    """What the store's queries need of a connection: awaitable ``execute``.

    An ``AsyncConnection``, or on SQLite an ``InlineConnection`` running on the event loop.
    """

    async def execute(self, statement: Any, parameters: Any = None) -> Any: ...

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any: ...


@dataclass
class Tx:
    """One write transaction: its connection, its dialect, and what to do around its commit.

    ``cache`` is the transaction's unit of work: projections keep the rows they read and
    change there (a batch of events touching one message reads and writes it once), and a
    ``before_commit`` hook writes them back. ``allocated``: per aggregate, the last seq this
    transaction reserved and how many it reserved in all.
    """

    conn: Any  # an AsyncConnection, or an InlineConnection on SQLite (the same awaitable API)
    dialect: DialectName
    stamp: Stamp | None = None
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    before_commit: list[Callable[[Tx], Awaitable[None]]] = field(default_factory=list)
    cache: dict[str, Any] = field(default_factory=dict)
    allocated: dict[str, tuple[int, int]] = field(default_factory=dict)

    async def prepare_commit(self) -> None:
        """Run the ``before_commit`` hooks (each once, in order, hooks added meanwhile too)."""
        while self.before_commit:
            await self.before_commit.pop(0)(self)

    @contextmanager
    def unstamped(self) -> Iterator[None]:
        """Events written meanwhile carry no claim: they belong to another session than the
        one this transaction's claim fences (a fork's log, made under its source's claim)."""
        stamp, self.stamp = self.stamp, None
        try:
            yield
        finally:
            self.stamp = stamp


def _sqlite_connect_hook(dbapi_connection: Any, _record: Any) -> None:
    # The driver must not open transactions itself: we issue BEGIN IMMEDIATE (writes) or
    # BEGIN (reads) in the "begin" hook.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    for pragma in sqlite_pragmas():
        cursor.execute(pragma)
    cursor.close()


def _sqlite_engine(url: str, *, immediate: bool, pool_size: int) -> AsyncEngine:
    # Every transaction is ended explicitly by its context manager, so the pool's reset on
    # return would only add a rollback (another thread hop through aiosqlite).
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=0,
        pool_timeout=600,
        pool_reset_on_return=None,
    )
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    event.listen(engine.sync_engine, "connect", _sqlite_connect_hook)
    event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql(begin))
    return engine


@dataclass(frozen=True)
class Pools:
    """PostgreSQL connections of one process, each pool bounded (settings ``db_pool_size``,
    ``db_pool_overflow``).

    An activity holds a connection only for one transaction (about a millisecond), never while
    a model streams or a tool runs, so a pool far smaller than ``max_concurrent_activities``
    serves them all: the defaults (10 + 10) serve 1,000 slots, and a worker process opens at
    most size + overflow + 2 (renewals) + 4 (the hot path, ``store.write.fast``) + 2 (LISTEN and
    NOTIFY) = 28 connections, well under PostgreSQL's default 100. A checkout waits at most a
    third of the lease, so a starved write fails (and is retried) before its lease runs out.
    """

    size: int = 10
    overflow: int = 10
    renewals: int = 2


def _postgres_engine(
    url: str, options: str, *, size: int, overflow: int, wait_s: float
) -> AsyncEngine:
    connect_args: dict[str, Any] = {"application_name": "sessionflow", "options": options}
    engine = create_async_engine(
        url,
        pool_size=size,
        max_overflow=overflow,
        pool_timeout=wait_s,
        connect_args=connect_args,
    )
    event.listen(engine.sync_engine, "checkout", _refuse_closed)
    return engine


def _refuse_closed(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    # An idle connection with something to read was told something while idle: nearly always
    # that the server is closing it. The pool then opens a fresh one (no SELECT 1 round trip).
    conn = dbapi_connection.driver_connection
    if conn.closed or conn.broken or not _quiet(conn.pgconn.socket):
        raise sa.exc.DisconnectionError("the server closed this connection while it was idle")


def _quiet(sock: int) -> bool:
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False


class InlineConnection:
    """A synchronous SQLite connection behind the awaitable API the store's writes use."""

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        if parameters is None:
            return self._conn.execute(statement)
        return self._conn.execute(statement, parameters)

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        if parameters is None:
            return self._conn.exec_driver_sql(statement)
        return self._conn.exec_driver_sql(statement, parameters)

    def driver_connection(self) -> Any:
        """The sqlite3 connection, inside this connection's transaction (``store.prepared``)."""
        return self._conn.connection.driver_connection


def _inline_connect_hook(dbapi_connection: Any, _record: Any) -> None:
    _sqlite_connect_hook(dbapi_connection, _record)
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA busy_timeout=0")  # never wait on the event loop
    cursor.close()


def _inline_sqlite_engine(url: str, *, immediate: bool) -> sa.Engine:
    sync_url = make_url(url).set(drivername="sqlite")
    if immediate:
        # The one writer: a second inline write cannot begin while one is open.
        engine = sa.create_engine(sync_url, pool_size=1, max_overflow=0, pool_timeout=600)
    else:
        # Never waits for a connection: a read in use while another begins (a read nested in
        # a write, or a caller that awaits inside its read) opens an overflow connection.
        engine = sa.create_engine(sync_url, pool_size=2, max_overflow=-1, pool_reset_on_return=None)
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    event.listen(engine, "connect", _inline_connect_hook)
    # Straight to sqlite3: it runs once per transaction, on the event loop.
    event.listen(engine, "begin", lambda conn: conn.connection.driver_connection.execute(begin))
    return engine


class _Kept:
    """Inline connections kept checked out between transactions (a pool checkout per
    transaction costs as much as a small read). Used from the event loop only."""

    def __init__(self, engine: sa.Engine, keep: int) -> None:
        self.engine = engine
        self.keep = keep
        self.idle: list[sa.Connection] = []

    def take(self) -> sa.Connection:
        return self.idle.pop() if self.idle else self.engine.connect()

    def give(self, conn: sa.Connection, *, clean: bool) -> None:
        """Keep ``conn`` for the next transaction if it ended cleanly, else hand it back."""
        if clean and len(self.idle) < self.keep:
            self.idle.append(conn)
        else:
            conn.close()

    def dispose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        self.engine.dispose()


_BUSY_ERRORS = (sa.exc.OperationalError, sqlite3.OperationalError)


def _is_busy(error: BaseException) -> bool:
    return "locked" in str(error) or "busy" in str(error)


class Database:
    """The engines of one store and the way every transaction is framed."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        pools: Pools | None = None,
    ) -> None:
        self.url = url
        self.dialect: DialectName = dialect_of(url)
        self.schema = schema
        self.waits = Waits.for_lease(lease_ms)
        self._writer: _Kept | None = None
        self._readers: _Kept | None = None
        if self.dialect == "sqlite":
            self._ensure_sqlite_dir(url)
            self.write_engine = _sqlite_engine(url, immediate=True, pool_size=1)
            self.read_engine = _sqlite_engine(url, immediate=False, pool_size=4)
            self._writer = _Kept(_inline_sqlite_engine(url, immediate=True), 1)
            self._readers = _Kept(_inline_sqlite_engine(url, immediate=False), 2)
            self.renew_engine = self.write_engine  # one writer either way
        else:
            pools = pools or Pools()
            options = postgres_options(url, schema, self.waits)
            wait_s = lease_ms / 3000
            self.write_engine = _postgres_engine(
                url, options, size=pools.size, overflow=pools.overflow, wait_s=wait_s
            )
            self.read_engine = self.write_engine
            self.renew_engine = _postgres_engine(
                url, options, size=pools.renewals, overflow=0, wait_s=wait_s
            )
        self._write_lock: asyncio.Lock | None = None

    @staticmethod
    def _ensure_sqlite_dir(url: str) -> None:
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)

    @property
    def psycopg_conninfo(self) -> str:
        """A libpq connection string for raw psycopg connections (the hot path, LISTEN), with
        the same options as the pool's."""
        url = make_url(self.url).set(drivername="postgresql")
        options = postgres_options(self.url, self.schema, self.waits)
        return make_conninfo(url.render_as_string(hide_password=False), options=options)

    @asynccontextmanager
    async def write(
        self, *, stamp: Stamp | None = None, renewal: bool = False
    ) -> AsyncIterator[Tx]:
        """A write transaction; after-commit callbacks run only if it commits, right then.

        ``renewal``: a claim renewal, which on PostgreSQL takes its own pool's connection.
        """
        with typed_errors():
            async with self.serialized():
                inline = self._inline_begin() if self._writer is not None else None
                if inline is not None:
                    assert self._writer is not None
                    sync, transaction = inline
                    tx = Tx(InlineConnection(sync), self.dialect, stamp)
                    clean = False
                    try:
                        with transaction:  # commits on the event loop: nothing can cut in
                            yield tx
                            await tx.prepare_commit()
                        clean = True
                    finally:
                        self._writer.give(sync, clean=clean)
                    _announce(tx)
                else:
                    engine = self.renew_engine if renewal else self.write_engine
                    async with engine.connect() as conn:
                        tx = Tx(conn, self.dialect, stamp)
                        async with conn.begin() as pooled:
                            yield tx
                            await tx.prepare_commit()
                            await settled(_commit_and_announce(pooled, tx))

    async def transact(
        self,
        work: Callable[[Tx], Awaitable[T]],
        *,
        stamp: Stamp | None = None,
        renewal: bool = False,
    ) -> T:
        """``work`` in a write transaction, run again from the start (a few times, after a
        jittered pause) when the database aborts it as a serialization failure or a deadlock.

        ``work`` may run more than once: it must touch nothing but its ``tx``.
        """

        async def once() -> T:
            async with self.write(stamp=stamp, renewal=renewal) as tx:
                return await work(tx)

        return await retry_conflicts(once)

    def _inline_begin(self) -> tuple[sa.Connection, sa.RootTransaction] | None:
        """Begin an inline SQLite write, or None when another process holds the write lock.

        Through aiosqlite every statement is a thread hop (~0.4 ms); a fenced write with its
        projections runs ten or more, holding this process's one writer all along. The inline
        connection runs them on the event loop in microseconds. It never waits for the lock
        (busy_timeout 0), so the loop cannot stall behind another process: then the write
        takes the aiosqlite path, whose connection waits in its thread.
        """
        assert self._writer is not None
        conn = self._writer.take()
        try:
            return conn, conn.begin()
        except _BUSY_ERRORS as error:
            conn.close()
            if _is_busy(error):
                return None
            raise

    @asynccontextmanager
    async def read(self, *, single: bool = False) -> AsyncIterator[Connection]:
        """A read transaction: one consistent snapshot for everything read inside it.

        ``single``: the caller runs one statement, its own snapshot: on PostgreSQL it runs
        without a transaction (no BEGIN, no COMMIT round trips).

        On SQLite it runs inline on the event loop, like writes (see ``_inline_begin``): a WAL
        reader never waits for the writer, and the thread hops of aiosqlite would cost far
        more than the read itself. In the rare moment a snapshot cannot be had at once (a
        database being recovered by another process), the read takes the aiosqlite path.
        """
        with typed_errors():
            inline = self._inline_snapshot() if self._readers is not None else None
            if inline is not None:
                assert self._readers is not None
                sync, transaction = inline
                clean = False
                try:
                    with transaction:
                        yield InlineConnection(sync)
                    clean = True
                finally:
                    self._readers.give(sync, clean=clean)
                return
            if single and self.dialect == "postgresql":
                async with self.read_engine.connect() as conn:
                    await conn.execution_options(isolation_level="AUTOCOMMIT")
                    yield conn
                return
            async with self.read_engine.connect() as conn, conn.begin():
                yield conn

    @asynccontextmanager
    async def reading(self, tx: Tx | None) -> AsyncIterator[Connection]:
        """Where a read of one statement runs: in ``tx`` when the caller holds one, else on a
        connection of its own (``read(single=True)``).

        A read inside a fenced transaction must never take a second connection: every
        connection of the pool could be held by a transaction waiting for one more, and the
        claim row stays locked while it waits."""
        if tx is not None:
            yield tx.conn
            return
        async with self.read(single=True) as conn:
            yield conn

    def _inline_snapshot(self) -> tuple[sa.Connection, sa.RootTransaction] | None:
        assert self._readers is not None
        conn = self._readers.take()
        try:
            transaction = conn.begin()
            # A deferred BEGIN takes its snapshot at the first read: take it now, where a
            # busy database can still be left to the waiting path.
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            return conn, transaction
        except _BUSY_ERRORS as error:
            conn.close()
            if _is_busy(error):
                return None
            raise

    @asynccontextmanager
    async def serialized(self) -> AsyncIterator[None]:
        """This process's SQLite writes, one at a time (a no-op on PostgreSQL)."""
        if self.dialect != "sqlite":
            yield
            return
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        async with self._write_lock:
            yield

    async def migrate(self) -> None:
        """Apply every Alembic migration (``upgrade head``), once even under concurrent opens.

        On PostgreSQL all of it, creating the schema too, runs in one transaction under an
        advisory lock taken first: ``CREATE SCHEMA IF NOT EXISTS`` is no guard against a
        concurrent creator (the loser hits a unique violation in ``pg_namespace``). A store
        already at head is only read, so a database that refuses writes still opens (its writes
        then fail typed); a migration the database refuses is a ``StoreUnavailableError``.
        """
        try:
            async with self.write_engine.connect() as conn:
                if await conn.run_sync(_at_head):
                    return
            await self._upgrade_locked()
        except DRIVER_ERRORS as error:
            typed = store_error(error)
            if not isinstance(typed, StoreUnavailableError) or sqlstate(error) is None:
                raise  # not refused by the database (unreachable, say): the caller's to word
            raise StoreOpenError(typed.reason) from error

    async def _upgrade_locked(self) -> None:
        async with self.serialized(), self.write_engine.connect() as conn, conn.begin():
            if self.dialect == "postgresql":
                # Alembic's own work between statements, on a busy machine, may idle past the
                # lease-derived bound too: it holds no claim row, so its bounds are its own.
                for bound in ("statement_timeout", "idle_in_transaction_session_timeout"):
                    await conn.exec_driver_sql(
                        f"SET LOCAL {bound} = {MIGRATION_STATEMENT_TIMEOUT_MS}"
                    )
                await conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
                if self.schema:
                    await conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            await conn.run_sync(_upgrade)

    async def dispose(self) -> None:
        for kept in (self._writer, self._readers):
            if kept is not None:
                kept.dispose()
        await self.write_engine.dispose()
        if self.renew_engine is not self.write_engine:
            await self.renew_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()


def _announce(tx: Tx) -> None:
    for callback in tx.after_commit:
        callback()


async def _commit_and_announce(transaction: Any, tx: Tx) -> None:
    await transaction.commit()
    _announce(tx)


async def settled(
    work: Coroutine[Any, Any, T], *, on_cancel: Callable[[], None] | None = None
) -> T:
    """Await ``work`` to its end even if cancelled meanwhile, then re-raise the cancellation.

    For what must happen as one unit, a commit and its announcement: cut off at its await, a
    commit still lands (in the driver's thread, or on the server), unannounced, and perhaps
    after the write lock was given up. ``on_cancel`` may ask ``work`` to end sooner.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while not task.done():
            with suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # seen: the cancellation wins over a failure
        raise


async def retry_conflicts(
    run: Callable[[], Awaitable[T]], *, attempts: int = CONFLICT_ATTEMPTS
) -> T:
    """``run()``, again after a jittered pause while it fails with ``TransactionConflictError``
    (the database aborted it whole); after ``attempts`` tries the error says how many."""
    for attempt in range(1, attempts + 1):
        try:
            return await run()
        except TransactionConflictError as error:
            if attempt == attempts:
                raise TransactionConflictError(error.sqlstate, attempt) from error
            await asyncio.sleep(0.01 * 2 ** (attempt - 1) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


# The newest migration (``tests/store/test_db.py`` holds it to Alembic's head): a store at it
# opens without loading Alembic and its scripts, a few hundred ms of every process's start.
SCHEMA_HEAD = "0009"


def _at_head(connection: sa.Connection) -> bool:
    """Whether the store's schema exists and its migrations are at head (reads only)."""
    try:
        rows = connection.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    except DRIVER_ERRORS:
        return False  # no schema yet (PostgreSQL aborts the read: the connection is reset)
    finally:
        if connection.in_transaction():
            connection.rollback()
    return {row[0] for row in rows} == {SCHEMA_HEAD}


def migration_config() -> Any:
    from alembic.config import Config  # only to migrate: most opens find the store at head

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _upgrade(connection: sa.Connection) -> None:
    from alembic import command

    config = migration_config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def default_sqlite_url(directory: str | os.PathLike[str]) -> str:
    return f"sqlite+aiosqlite:///{Path(directory) / 'sessionflow.db'}"
