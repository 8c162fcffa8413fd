"""A persistence fault injector at the driver boundary (catalogue C2, C6).

Faults are armed by count, never drawn at random, so a test that arms them always meets them:
``arm(commit_then_fail=1)`` makes the next store commit land and then raise a lost connection
to its caller (Temporal's ``ExecuteAndTimeout``); ``arm(before=[...])`` makes the next
statements fail before they run with the given faults; ``strike(marker, [...])`` makes the next
write statements on PostgreSQL that carry ``marker`` (in their SQL or their parameters: a stored
event type, a column being set) fail with the given faults, one each, in order. Every path
the store writes through is covered: SQLAlchemy connections (all engines, by class-level
events), and the hot path's own driver connections (``store.write.fast``: psycopg autocommit
connections, sqlite3 connections), which are wrapped where that module opens them.
"""

from __future__ import annotations

import sqlite3
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from temporalio import activity

from store import Store
from store.write.fast import PostgresWriter

Fault = Literal["serialization", "deadlock", "connection", "timeout", "busy", "commit_then_fail"]


def driver_error(fault: Fault, dialect: str) -> Exception:
    """The error the driver raises for ``fault`` (what the database or the network does)."""
    if dialect == "sqlite":
        # SQLite's one transient: the write lock another connection holds (SQLITE_BUSY).
        return sqlite3.OperationalError("database is locked")
    if fault == "serialization":
        return psycopg.errors.SerializationFailure("could not serialize access (injected)")
    if fault == "deadlock":
        return psycopg.errors.DeadlockDetected("deadlock detected (injected)")
    if fault == "timeout":
        return psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
    return psycopg.OperationalError("server closed the connection unexpectedly (injected)")


@dataclass
class Injector:
    """Count-armed faults; ``seen`` counts what was injected, by kind."""

    commits_to_fail: int = 0
    before: list[Fault] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    # The chaos mode (C6): every ``period``-th statement meets the next fault of ``cycle``.
    period: int = 0
    cycle: tuple[Fault, ...] = ()
    _statements: int = 0
    _turn: int = 0
    # Chaos's lost commit answers strike the hot path (a turn's batches), whose statements
    # always write; a read's commit has nothing to lose.
    _hot_commits: int = 0
    # Chaos's statement faults that struck SQLAlchemy's pooled connections (the fenced path
    # that ``run_fenced`` retries), not the hot path's own.
    pooled_struck: int = 0
    # Stored event types whose write's commit lands and then loses its answer, once each
    # (PostgreSQL: SQLite's inline statements run on the driver, unseen by these events).
    commit_on: list[str] = field(default_factory=list)
    # Statement faults aimed at one write (PostgreSQL's pooled connections): (marker, fault).
    strikes: list[tuple[str, Fault]] = field(default_factory=list)
    # Each aimed fault as it struck: (marker, fault, (the Temporal activity's type, id and
    # attempt; empty outside an activity)).
    struck: list[tuple[str, Fault, tuple[str, str, int] | tuple[()]]] = field(default_factory=list)

    def arm(self, *, commit_then_fail: int = 0, before: list[Fault] | None = None) -> None:
        self.commits_to_fail += commit_then_fail
        self.before += before or []

    def strike(self, marker: str, faults: list[Fault]) -> None:
        """The next write statements carrying ``marker`` meet ``faults``, one each: on the
        pooled connections or the hot path's (a step's end is one statement there)."""
        self.strikes += [(marker, fault) for fault in faults]

    def _aimed(self, statement: str, parameters: Any, dialect: str) -> Exception | None:
        for i, (marker, fault) in enumerate(self.strikes):
            if marker in statement or self._carries(parameters, marker):
                del self.strikes[i]
                info = activity.info() if activity.in_activity() else None
                where = (info.activity_type, info.activity_id, info.attempt) if info else ()
                self.struck.append((marker, fault, where))
                self._note(f"{fault}:{marker}")
                return driver_error(fault, dialect)
        return None

    def chaos(self, period: int, cycle: tuple[Fault, ...]) -> None:
        """From now on, every ``period``-th statement meets the next fault of ``cycle``
        (counted, not drawn: a run meets its faults at the same points of the count), on
        SQLAlchemy's connections and the hot path's alike."""
        self.period, self.cycle, self._statements = period, cycle, 0

    def _tick(self) -> None:
        if not self.period:
            return
        self._statements += 1
        if self._statements % self.period == 0:
            fault = self.cycle[self._turn % len(self.cycle)]
            self._turn += 1
            # Armed, never piled up: a fault no statement met yet is not armed twice.
            if fault == "commit_then_fail":
                self._hot_commits = 1
            elif fault not in self.before:
                self.before.append(fault)

    def _note(self, kind: str) -> None:
        self.seen[kind] = self.seen.get(kind, 0) + 1

    def take_commit(self, *, hot: bool = False) -> bool:
        if hot and self._hot_commits > 0:
            self._hot_commits -= 1
        elif self.commits_to_fail > 0:
            self.commits_to_fail -= 1
        else:
            return False
        self._note("commit_then_fail")
        return True

    def take_before(self, dialect: str, *, inside: bool) -> Exception | None:
        """The next statement-level fault, if one is armed. SQLite's busy only strikes a
        transaction's first statement (``BEGIN IMMEDIATE``, ``inside=False``), as the real
        lock does; PostgreSQL's faults strike any statement."""
        self._tick()
        if not self.before or (dialect == "sqlite" and inside):
            return None
        fault = self.before.pop(0)
        self._note(fault)
        return driver_error(fault, dialect)

    # --- SQLAlchemy connections -----------------------------------------------------------------

    def _before_execute(
        self, conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any
    ) -> None:
        dialect = conn.dialect.name
        hit = self._matching(parameters)
        if hit is not None:
            conn.info["faults.commit_on"] = hit
        if statement.lstrip().upper().startswith(("BEGIN", "SAVEPOINT", "RELEASE")):
            return
        if dialect == "sqlite":
            return  # SQLite's transient strikes at BEGIN (``_begin``)
        if not _writes(statement):
            return  # READ COMMITTED never aborts a plain read as a conflict
        aimed = self._aimed(statement, parameters, dialect)
        if aimed is not None:
            raise aimed
        error = self.take_before(dialect, inside=True)
        if error is not None:
            self.pooled_struck += 1
            raise error

    def _begin(self, conn: Any) -> None:
        conn.info.pop("faults.commit_on", None)  # a match belongs to its own transaction
        if conn.dialect.name == "sqlite":
            error = self.take_before("sqlite", inside=False)
            if error is not None:
                raise error

    def _matching(self, parameters: Any) -> str | None:
        """The armed event type these parameters insert, if any."""
        for marker in self.commit_on:
            if self._carries(parameters, marker):
                return marker
        return None

    @staticmethod
    def _carries(parameters: Any, marker: str) -> bool:
        """Whether a parameter is ``marker``, or a list holding it (the hot path passes a
        batch's event types as one array)."""
        sets = parameters if isinstance(parameters, list | tuple) else [parameters]
        return any(
            value == marker or (isinstance(value, list) and marker in value)
            for one in sets
            if isinstance(one, dict)
            for value in one.values()
        )

    def _commit(self, conn: Any) -> None:
        hit = conn.info.pop("faults.commit_on", None)
        if hit is not None and hit in self.commit_on:
            self.commit_on.remove(hit)
            self._note(f"commit_then_fail:{hit}")
        elif not self.take_commit():
            return
        conn.connection.dbapi_connection.commit()  # it lands; then the answer is lost
        raise driver_error("connection", conn.dialect.name)

    # --- the hot path's own driver connections --------------------------------------------------

    def wrap_psycopg(self, conn: Any) -> Any:
        return _Psycopg(conn, self)

    def wrap_sqlite(self, conn: sqlite3.Connection) -> Any:
        return _Sqlite(conn, self)


def _writes(statement: str) -> bool:
    words = " ".join(statement.split()).upper()
    if words.startswith("WITH "):  # the hot path's statements: CTEs that write
        return any(verb in words for verb in ("INSERT INTO", "UPDATE ", "DELETE FROM"))
    return words[:6] in ("INSERT", "UPDATE", "DELETE") or "FOR UPDATE" in words


class _Psycopg:
    """An autocommit psycopg connection: each statement is its own commit."""

    def __init__(self, conn: Any, injector: Injector) -> None:
        self._conn = conn
        self._injector = injector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        if not _writes(str(args[0])):
            # A step's end reads its message here first: READ COMMITTED never aborts a plain
            # read as a conflict, and a read's commit has nothing to lose.
            return await self._conn.execute(*args, **kwargs)
        parameters = args[1] if len(args) > 1 else kwargs.get("params")
        aimed = self._injector._aimed(str(args[0]), parameters, "postgresql")
        if aimed is not None:
            raise aimed
        error = self._injector.take_before("postgresql", inside=True)
        if error is not None:
            raise error
        hit = self._injector._matching(parameters)
        cursor = await self._conn.execute(*args, **kwargs)
        if hit is not None:
            self._injector.commit_on.remove(hit)
            self._injector._note(f"commit_then_fail:{hit}")
            await cursor.fetchall()
            raise driver_error("connection", "postgresql")
        if self._injector.take_commit(hot=True):
            await cursor.fetchall()
            raise driver_error("connection", "postgresql")
        return cursor


class _Sqlite:
    def __init__(self, conn: sqlite3.Connection, injector: Injector) -> None:
        self._conn = conn
        self._injector = injector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("BEGIN"):
            error = self._injector.take_before("sqlite", inside=False)
            if error is not None:
                raise error
        result = self._conn.execute(sql, *args)
        if sql == "COMMIT" and self._injector.take_commit(hot=True):
            raise sqlite3.OperationalError("disk I/O error (injected after the commit)")
        return result

    def executemany(self, sql: str, rows: Any) -> Any:
        return self._conn.executemany(sql, rows)


@contextmanager
def injecting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Injector]:
    """An ``Injector`` over every store connection opened or used while it is active."""
    injector = Injector()
    listeners = [
        ("before_cursor_execute", injector._before_execute),
        ("begin", injector._begin),
        ("commit", injector._commit),
    ]
    for name, fn in listeners:
        event.listen(sa.Engine, name, fn)
    real_connect = psycopg.AsyncConnection.connect

    async def connect(*args: Any, **kwargs: Any) -> Any:
        conn = await real_connect(*args, **kwargs)
        if kwargs.get("application_name") == "sessionflow-append":
            return injector.wrap_psycopg(conn)
        return conn

    fake_psycopg = types.SimpleNamespace(
        AsyncConnection=types.SimpleNamespace(connect=connect), Error=psycopg.Error
    )
    fake_sqlite3 = types.SimpleNamespace(
        connect=lambda *a, **k: injector.wrap_sqlite(sqlite3.connect(*a, **k)),
        Error=sqlite3.Error,
        OperationalError=sqlite3.OperationalError,
        Connection=sqlite3.Connection,
    )
    monkeypatch.setattr("store.write.fast.psycopg", fake_psycopg)
    monkeypatch.setattr("store.write.fast.sqlite3", fake_sqlite3)
    try:
        yield injector
    finally:
        for name, fn in listeners:
            event.remove(sa.Engine, name, fn)


@asynccontextmanager
async def answer_lost(
    store: Store, monkeypatch: pytest.MonkeyPatch, event_type: str
) -> AsyncIterator[Injector]:
    """C2 on a PostgreSQL ``store``: the next write of an ``event_type`` event commits, then
    its answer is lost. The hot path's connections are opened again under the injector first
    (those opened before it are not wrapped)."""
    with injecting(monkeypatch) as faults:
        assert isinstance(store.writer, PostgresWriter), "the injector reaches PostgreSQL's commit"
        await store.writer.close()  # its next connections are the injector's
        faults.commit_on.append(event_type)
        yield faults
