"""Everything that differs between SQLite and PostgreSQL, in one place."""

from __future__ import annotations

from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement

DialectName = Literal["sqlite", "postgresql"]

# One fixed LISTEN/NOTIFY channel: channel names are limited to 63 bytes, so they are never
# built from ids; the payload carries "<aggregate id> <seq>", never user text.
NOTIFY_CHANNEL = "sessionflow_events"


def dialect_of(url: str) -> DialectName:
    if url.startswith("sqlite"):
        return "sqlite"
    if url.startswith("postgresql"):
        return "postgresql"
    raise ValueError(
        f"Unsupported database URL {url!r}: use sqlite+aiosqlite:///path/to/file.db "
        f"or postgresql+psycopg://user@host/db"
    )


def now_ms(dialect: DialectName) -> ColumnElement[int]:
    """The database clock in epoch milliseconds.

    PostgreSQL uses ``clock_timestamp()``: ``now()`` is frozen at the transaction's start, so a
    long transaction would compare leases against a stale time.
    """
    if dialect == "postgresql":
        return sa.cast(
            sa.func.floor(sa.extract("epoch", sa.func.clock_timestamp()) * 1000), sa.BigInteger
        )
    return sa.cast((sa.func.julianday("now") - 2440587.5) * 86400000.0, sa.BigInteger)


def insert(dialect: DialectName, table: sa.Table) -> Any:
    """The dialect's INSERT, which supports ``on_conflict_do_nothing/update``."""
    if dialect == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def for_update(dialect: DialectName, select: sa.Select[Any]) -> sa.Select[Any]:
    """Row lock on PostgreSQL; SQLite write transactions are already exclusive."""
    return select.with_for_update() if dialect == "postgresql" else select


def is_unique_violation(error: BaseException) -> bool:
    orig = getattr(error, "orig", error)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is not None:
        return bool(sqlstate == "23505")
    return "UNIQUE constraint failed" in str(orig)
