"""Everything that differs between SQLite and PostgreSQL, in one place."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.sql.elements import ColumnElement

from sessionflow.errors import StoreError, StoreUnavailableError, TransactionConflictError

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


@dataclass(frozen=True)
class Waits:
    """How long a PostgreSQL connection may wait, each bound below the claim lease.

    A stalled owner (a paused process, a blocked event loop) holding its claim row inside a
    transaction must not keep a takeover waiting past the lease: the server ends a transaction
    left idle for ``idle_in_transaction_ms`` (releasing its locks) and a statement running for
    ``statement_ms``, and an acquisition gives up on the claim row lock after
    ``claim_lock_ms`` (``ClaimHeldError``: retry later).
    """

    statement_ms: int
    idle_in_transaction_ms: int
    claim_lock_ms: int

    @classmethod
    def for_lease(cls, lease_ms: int) -> Waits:
        return cls(
            statement_ms=lease_ms // 2,
            idle_in_transaction_ms=lease_ms // 2,
            claim_lock_ms=lease_ms // 6,
        )


def postgres_options(url: str, schema: str | None, waits: Waits) -> str:
    """The libpq ``options`` of every connection, raw or pooled (the URL's own come first).

    The store's locking -- ``FOR UPDATE`` of the claim row, ``ON CONFLICT`` on the sequence row
    -- is written for READ COMMITTED, where a writer waits for the row and then sees its latest
    version; under REPEATABLE READ or SERIALIZABLE concurrent writers fail with serialization
    errors instead. So the level is pinned here, above any database or role default.
    """
    own = make_url(url).query.get("options", ())
    parts = [own] if isinstance(own, str) else list(own)
    if schema:
        parts.append(f"-csearch_path={schema}")
    parts += [
        r"-cdefault_transaction_isolation=read\ committed",
        f"-cstatement_timeout={waits.statement_ms}",
        f"-cidle_in_transaction_session_timeout={waits.idle_in_transaction_ms}",
    ]
    return " ".join(parts)


def now_ms(dialect: DialectName) -> ColumnElement[int]:
    """The database clock in epoch milliseconds.

    PostgreSQL uses ``clock_timestamp()``: ``now()`` is frozen at the transaction's start, so a
    long transaction would compare leases against a stale time.
    """
    # Constants as literals, not parameters: the hot path's one-statement writes embed this
    # clock in their SQL text (``store/fence.py``), where no parameter could carry them.
    if dialect == "postgresql":
        epoch = sa.extract("epoch", sa.func.clock_timestamp())
        return sa.cast(sa.func.floor(epoch * sa.literal_column("1000")), sa.BigInteger)
    days = sa.func.julianday(sa.literal_column("'now'")) - sa.literal_column("2440587.5")
    return sa.cast(days * sa.literal_column("86400000.0"), sa.BigInteger)


def insert(dialect: DialectName, table: sa.Table) -> Any:
    """The dialect's INSERT, which supports ``on_conflict_do_nothing/update``."""
    if dialect == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def for_update(dialect: DialectName, select: sa.Select[Any]) -> sa.Select[Any]:
    """Row lock on PostgreSQL; SQLite write transactions are already exclusive."""
    return select.with_for_update() if dialect == "postgresql" else select


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a PostgreSQL error, raw or wrapped by SQLAlchemy (None on SQLite)."""
    code = getattr(getattr(error, "orig", error), "sqlstate", None)
    return code if isinstance(code, str) else None


def is_unique_violation(error: BaseException) -> bool:
    code = sqlstate(error)
    if code is not None:
        return code == "23505"
    return "UNIQUE constraint failed" in str(getattr(error, "orig", error))


def is_lock_timeout(error: BaseException) -> bool:
    return sqlstate(error) == "55P03"


DRIVER_ERRORS = (sa.exc.DBAPIError, psycopg.Error, sqlite3.Error)
# Serialization failure and deadlock: the database aborted the transaction, which is safe to
# run again from the start.
CONFLICTS = frozenset({"40001", "40P01"})
_UNAVAILABLE = {
    "57014": "a statement ran past its statement timeout",
    "55P03": "a lock was not granted within the lock timeout",
    "25P03": "a transaction stayed idle past its timeout, and the server closed its connection",
    "25006": "the database is read-only",
}
_SQLITE_UNAVAILABLE = (
    "database is locked",
    "disk i/o error",
    "database or disk is full",
    "readonly database",
    "unable to open database file",
)


def store_error(error: BaseException) -> StoreError | None:
    """The store's typed error for a driver error that says the database, not the statement,
    failed: a conflict to retry, or the database unavailable. None for anything else."""
    code = sqlstate(error)
    if code in CONFLICTS:
        return TransactionConflictError(code, 1)
    if code in _UNAVAILABLE:
        return StoreUnavailableError(f"{_UNAVAILABLE[code]} (SQLSTATE {code})")
    orig = getattr(error, "orig", error)
    dropped = getattr(error, "connection_invalidated", False)
    if dropped or isinstance(orig, psycopg.OperationalError):
        lines = str(orig).strip().splitlines()
        return StoreUnavailableError(f"the connection failed ({lines[0] if lines else code})")
    if isinstance(orig, sqlite3.OperationalError) and any(
        text in str(orig).lower() for text in _SQLITE_UNAVAILABLE
    ):
        return StoreUnavailableError(f"SQLite: {orig}")
    return None


@contextmanager
def typed_errors() -> Iterator[None]:
    """Driver errors raised inside surface as the store's typed errors (``store_error``)."""
    try:
        yield
    except DRIVER_ERRORS as error:
        typed = store_error(error)
        if typed is None:
            raise
        raise typed from error
