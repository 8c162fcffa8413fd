"""Engines, transactions and migrations.

SQLite: WAL, ``BEGIN IMMEDIATE`` for every write transaction (a deferred transaction that
upgrades to a write gets SQLITE_BUSY at once, ignoring busy_timeout), a busy timeout of several
seconds, and one writer connection per process through which that process's writes are
serialized (several writers racing on one file starve each other for seconds).
PostgreSQL: one pool; fenced transactions lock the claim row; READ COMMITTED is enough.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from store.dialect import DialectName, dialect_of

SQLITE_BUSY_TIMEOUT_MS = 10_000
MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK_KEY = 0x5E55_F10


@dataclass(frozen=True)
class Stamp:
    """The claim a fenced transaction runs under; stamped on every event it writes."""

    execution_id: str
    epoch: int


@dataclass
class Tx:
    """One write transaction: its connection, its dialect, and what to do after it commits."""

    conn: AsyncConnection
    dialect: DialectName
    stamp: Stamp | None = None
    after_commit: list[Callable[[], None]] = field(default_factory=list)


def _sqlite_connect_hook(dbapi_connection: Any, _record: Any) -> None:
    # The driver must not open transactions itself: we issue BEGIN IMMEDIATE (writes) or
    # BEGIN (reads) in the "begin" hook. WAL lets readers run beside the one writer;
    # synchronous=FULL makes every acknowledged commit survive power loss.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    for pragma in (
        "PRAGMA journal_mode=WAL",
        f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
        "PRAGMA foreign_keys=ON",
        "PRAGMA synchronous=FULL",
    ):
        cursor.execute(pragma)
    cursor.close()


def _sqlite_engine(url: str, *, immediate: bool, pool_size: int) -> AsyncEngine:
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=0, pool_timeout=600)
    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"
    event.listen(engine.sync_engine, "connect", _sqlite_connect_hook)
    event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql(begin))
    return engine


def _postgres_engine(url: str, schema: str | None) -> AsyncEngine:
    connect_args: dict[str, Any] = {"application_name": "sessionflow"}
    if schema:
        connect_args["options"] = f"-csearch_path={schema}"
    return create_async_engine(
        url, pool_size=10, max_overflow=20, pool_pre_ping=True, connect_args=connect_args
    )


class Database:
    """The engines of one store and the way every transaction is framed."""

    def __init__(self, url: str, *, schema: str | None = None) -> None:
        self.url = url
        self.dialect: DialectName = dialect_of(url)
        self.schema = schema
        if self.dialect == "sqlite":
            self._ensure_sqlite_dir(url)
            self.write_engine = _sqlite_engine(url, immediate=True, pool_size=1)
            self.read_engine = _sqlite_engine(url, immediate=False, pool_size=4)
        else:
            self.write_engine = _postgres_engine(url, schema)
            self.read_engine = self.write_engine
        self._write_lock: asyncio.Lock | None = None

    @staticmethod
    def _ensure_sqlite_dir(url: str) -> None:
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)

    @property
    def psycopg_conninfo(self) -> str:
        """A libpq connection string for raw psycopg connections (the LISTEN connection)."""
        url = make_url(self.url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    @asynccontextmanager
    async def write(self, *, stamp: Stamp | None = None) -> AsyncIterator[Tx]:
        """A write transaction; after-commit callbacks run only if it commits."""
        async with self.serialized(), self.write_engine.connect() as conn:
            tx = Tx(conn, self.dialect, stamp)
            async with conn.begin():
                yield tx
        for callback in tx.after_commit:
            callback()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read transaction: one consistent snapshot for everything read inside it."""
        async with self.read_engine.connect() as conn, conn.begin():
            yield conn

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
        """Apply every Alembic migration (``upgrade head``), once even under concurrent opens."""
        if self.dialect == "postgresql" and self.schema:
            async with self.write_engine.begin() as conn:
                await conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
        async with self.write() as tx:
            if self.dialect == "postgresql":
                await tx.conn.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
            await tx.conn.run_sync(_upgrade)

    async def dispose(self) -> None:
        await self.write_engine.dispose()
        if self.read_engine is not self.write_engine:
            await self.read_engine.dispose()


def _upgrade(connection: sa.Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def default_sqlite_url(directory: str | os.PathLike[str]) -> str:
    return f"sqlite+aiosqlite:///{Path(directory) / 'sessionflow.db'}"
