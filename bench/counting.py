"""Statements and round trips of this process, attributed to whatever activity issued them.

Installed by the drain benchmark only (no product code changes). On PostgreSQL it wraps the
psycopg methods every statement goes through, SQLAlchemy's and the hot path's alike: a round trip
is a statement sent (``executemany`` is one: psycopg pipelines it), the ``BEGIN`` psycopg sends
before the first statement of a transaction, and a ``COMMIT`` or ``ROLLBACK`` that reaches the
server. On SQLite, where nothing goes over a wire, it counts the statements sqlite3 runs (its
trace callback, set on every connection this process opens).

Each count goes to the activity type in ``scope`` (a context variable the benchmark's worker
interceptor sets for an activity's task and everything it spawns), else to ``"other"``.
"""

from __future__ import annotations

import collections
import contextvars
import os
import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

# SESSIONFLOW_BENCH_TRACE=file: each statement's scope, whether a BEGIN went before it, and its
# first 160 characters, one line each (PostgreSQL), to find where the round trips go.
_TRACE_PATH = os.environ.get("SESSIONFLOW_BENCH_TRACE")
_TRACE = open(_TRACE_PATH, "w", buffering=1) if _TRACE_PATH else None  # noqa: SIM115


def _sql(args: tuple[Any, ...]) -> str:
    query = args[0] if args else ""
    return " ".join(str(query).split())[:160]


scope: contextvars.ContextVar[str] = contextvars.ContextVar("bench_scope", default="other")


class Counter:
    """Round trips (PostgreSQL) or statements (SQLite) per scope, since install."""

    def __init__(self) -> None:
        self.trips: collections.Counter[str] = collections.Counter()
        self._installed = False

    def total(self) -> int:
        return sum(self.trips.values())

    def snapshot(self) -> collections.Counter[str]:
        return collections.Counter(self.trips)

    def count(self, n: int = 1) -> None:
        self.trips[scope.get()] += n

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        _wrap_psycopg(self)
        _wrap_sqlite(self)


def _begins(conn: psycopg.AsyncConnection[Any]) -> int:
    """1 if psycopg will send a BEGIN before the next statement on ``conn``."""
    idle = conn.info.transaction_status == TransactionStatus.IDLE
    return 1 if idle and not conn.autocommit and conn._pipeline is None else 0


def _wrap_psycopg(counter: Counter) -> None:
    cursor = psycopg.AsyncCursor
    execute, executemany = cursor.execute, cursor.executemany
    commit, rollback = psycopg.AsyncConnection.commit, psycopg.AsyncConnection.rollback

    async def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter.count(1 + _begins(self.connection))
        if _TRACE is not None:
            _TRACE.write(f"{scope.get()}\t{_begins(self.connection)}\t{_sql(args)}\n")
        return await execute(self, *args, **kwargs)

    async def counted_executemany(self: Any, *args: Any, **kwargs: Any) -> Any:
        counter.count(1 + _begins(self.connection))
        return await executemany(self, *args, **kwargs)

    def ending(original: Callable[..., Any]) -> Callable[..., Any]:
        async def counted(self: Any) -> Any:
            if self.info.transaction_status != TransactionStatus.IDLE:
                counter.count()
            return await original(self)

        return counted

    cursor.execute = counted_execute  # type: ignore[method-assign]
    cursor.executemany = counted_executemany  # type: ignore[method-assign]
    psycopg.AsyncConnection.commit = ending(commit)  # type: ignore[method-assign]
    psycopg.AsyncConnection.rollback = ending(rollback)  # type: ignore[method-assign]


def _wrap_sqlite(counter: Counter) -> None:
    connect = sqlite3.connect

    def counted_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(lambda _sql: counter.count())
        return conn

    # SQLAlchemy's pysqlite dialect connects through ``sqlite3.dbapi2``, the rest through
    # ``sqlite3``: the same function under two names.
    sqlite3.connect = counted_connect  # type: ignore[assignment]
    sqlite3.dbapi2.connect = counted_connect  # type: ignore[assignment]
