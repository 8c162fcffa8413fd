"""The hot path: fenced appends of events that have no projector (token deltas).

A turn streams most of its events as deltas, in short batches. Each batch is one fenced
transaction, so its cost is mostly framing: on SQLite every statement through aiosqlite is a
thread hop, on PostgreSQL every statement a round trip. This path does the same work as
``claims.fenced`` + ``events.publish_many`` -- renew the claim (database clock, same fence,
step attempt), reserve the seqs under the sequence row lock, insert the rows -- in one thread
hop on SQLite (a dedicated connection on the process's writer lock) and in one round trip on
PostgreSQL (one autocommitted statement). The doorbells ring after the commit (``on_commit``).

As in ``Database.write``, a commit and its announcement (``on_commit``) are one unit that a
cancellation cannot cut in two, and the database's refusals surface as typed errors.
"""

from __future__ import annotations

import asyncio
import select
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import make_url

from store.db import (
    SQLITE_BUSY_TIMEOUT_MS,
    Database,
    retry_conflicts,
    settled,
    sqlite_pragmas,
)
from store.dialect import store_error
from store.events import unique_violation_error
from store.prepared import Prepared, compile_text
from store.write.allocation import allocation
from store.write.fence import NOW, Fence, fence, fence_ctes

IDLE = TransactionStatus.IDLE
T = TypeVar("T")
Connection = psycopg.AsyncConnection[Any]
OnCommit = Callable[[], None]
# The writer thread waits for another process's lock in slices, so a cancelled append it
# holds can give up between them instead of committing up to a busy timeout later.
_BUSY_SLICE_MS = 50
# The fence, from its one definition (``store/fence.py``): a batch may carry no step attempt.
_SQLITE_RENEW = compile_text(fence("sqlite", Fence(attempt="optional"), ("expires_at",)), "sqlite")
_SQLITE_ALLOCATE = compile_text(allocation("sqlite"), "sqlite")
_INSERT = """
INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
VALUES (:id, :aggregate_id, :seq, :created, :type, :data, :execution_id, :epoch)
"""

_PG_NOW = NOW["postgresql"]
# The fence and the batch's events, as CTEs: the claim renewed (never shortened; the fence's
# CTEs end with ``renewed``), the seqs allocated under the sequence row only if it was, and the
# events inserted at them.
_PG_RENEWED = fence_ctes(Fence(attempt="optional"))


def _pg_allocated(after: str, **options: Any) -> str:
    """Seq allocation (``events.allocation``) as the CTE ``allocated``, after ``after``."""
    statement = allocation("postgresql", after=after, **options)
    return f"allocated AS ({compile_text(statement, 'postgresql')})"


_PG_ALLOCATED = _pg_allocated("renewed")
_PG_INSERTED = """
inserted AS (
  INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
  SELECT e.id, %(agg)s, a.seq - %(n)s + e.ord, e.created, e.type, e.data, %(eid)s, %(epoch)s
  FROM allocated a,
       unnest(%(ids)b::text[], %(createds)b::bigint[], %(types)b::text[], %(datas)b::text[])
         WITH ORDINALITY AS e(id, created, type, data, ord)
  RETURNING seq
)"""
_PG_EVENTS = f"{_PG_ALLOCATED}, {_PG_INSERTED}"
_PG_APPEND = f"""
WITH {_PG_RENEWED}, {_PG_EVENTS}
SELECT (SELECT seq FROM allocated) AS last, (SELECT count(*) FROM inserted) AS written
"""

# A turn's batch whose events change only parts of its assistant message (text, reasoning,
# tool input and calls; deltas): the fence, the changed parts (projected by the caller on the
# turn's own view of the message, ``projector.project_parts``), the seqs and the events, in one
# statement. Every writer of a session renews its claim row first, so they take the rows
# after it one at a time.


def _pg_part_rows(after: str) -> str:
    """The changed parts' rows, written only once the CTE ``after`` (the fence, or what came
    after it) returned a row."""
    return f"""
parts AS (
  INSERT INTO session_part (message_id, position, session_id, call_id, data)
  SELECT %(mid)s, p.position, %(sid)s, p.call_id, p.data
  FROM {after},
       unnest(%(positions)b::int[], %(call_ids)b::text[], %(parts)b::text[])
         AS p(position, call_id, data)
  ON CONFLICT (message_id, position)
    DO UPDATE SET call_id = excluded.call_id, data = excluded.data
  RETURNING 1
)"""


_PG_PARTS = f"""
WITH {_PG_RENEWED}, {_pg_part_rows("renewed")}, {_PG_EVENTS}
SELECT (SELECT seq FROM allocated) AS last, (SELECT count(*) FROM parts) AS parts
"""

# A tool call's settlement (or any event that changes one tool part and nothing else): the
# fence (with the call's attempt, as ``claims.fenced(run=...)``), the part's new state written
# only if the part is still what the caller read, the seq and the event, in one statement.
_PG_SETTLE = f"""
WITH {fence_ctes(Fence(run=True, take=True))}, changed AS (
  UPDATE session_part SET data = %(part)s
  WHERE message_id = %(mid)s AND position = %(position)s AND session_id = %(sid)s
    AND data = %(before)s AND EXISTS (SELECT 1 FROM renewed)
  RETURNING 1
), {_pg_allocated("changed", agg="sid", n=1)}, inserted AS (
  INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
  SELECT %(id)s, %(sid)s, seq, %(created)s, %(type)s, %(data)s, %(eid)s, %(epoch)s
  FROM allocated
  RETURNING seq
)
SELECT (SELECT seq FROM inserted)
"""

# A turn's first batch, which starts its step (``Store.append`` with a ``TurnView`` carrying the
# opening's ``StepBasis``): the fence; the seqs, only while the session's log is still at the seq
# the opening read (every projection moves it, so the step starts on what the opening found);
# the events; the step's new message and the parts the batch changed (built and projected by the
# caller). A log that moved writes nothing but the renewal, as any fenced append renews.
_PG_START = f"""
WITH {_PG_RENEWED}, allocated AS (
  UPDATE event_sequence SET seq = seq + %(n)s
  WHERE aggregate_id = %(agg)s AND seq = %(expected)s AND EXISTS (SELECT 1 FROM renewed)
  RETURNING seq
), {_PG_INSERTED}, message AS (
  INSERT INTO session_message (id, session_id, type, seq, time_created, time_updated, data)
  SELECT %(mid)s, %(sid)s, 'assistant', %(message_seq)s, %(created)s, %(created)s, %(body)s
  FROM allocated
  RETURNING 1
), {_pg_part_rows("allocated")}
SELECT (SELECT seq FROM allocated) AS last
"""

# The fence of a write decided from a read made outside any transaction (``_PG_STEP_READ``,
# ``Sessions.turn_snapshot``): with the step's attempt, recording the phase as ``record_phase``
# does, and only while the claim row is still the version that read saw.
_PG_RENEWED_AS_READ = fence_ctes(
    Fence(attempt="advance", phase=True, version=True, phase_param="phase", mid_param="mid")
)

# A turn's opening (``Store.open_turn``), decided from what ``Store.turn_snapshot`` read: the
# fence, with the step's attempt and the claim row's version as read (``_PG_STEP_READ``), records
# that a model call is in flight, and the session counts the request.
_PG_OPEN_TURN = f"""
WITH {_PG_RENEWED_AS_READ}, counted AS (
  UPDATE session SET request_count = request_count + 1
  WHERE id = %(sid)s AND EXISTS (SELECT 1 FROM renewed)
  RETURNING request_count
)
SELECT (SELECT request_count FROM counted)
"""

# A step's assistant message as its end reads it (``Store.step_snapshot``), first the version of
# the session's claim row: ``xmin``, the transaction that last wrote the row. Every fenced write
# renews that row in its own transaction, so a write fenced on the version too (``_PG_END_STEP``)
# applies only if no fenced write, nor anything else that could have changed the message, came
# between the read and it (xmin as an optimistic concurrency token, as Npgsql offers it).
_PG_STEP_READ = """
SELECT -2 AS position, xmin::text AS data FROM session_execution WHERE session_id = %(sid)s
UNION ALL
SELECT -1, data FROM session_message WHERE id = %(mid)s AND session_id = %(sid)s
UNION ALL
SELECT position, data FROM session_part WHERE message_id = %(mid)s AND session_id = %(sid)s
ORDER BY position
"""

# A step's end (``Store.end_step``): the fence, with the step's attempt and the claim row's
# version as read, recording the phase as ``record_phase`` does; the seqs and the events; the
# message's row and parts as the events left them (projected in memory by the caller); the
# session's usage (``projector._ADD_USAGE``); and, read with it, what waits to be promoted (as
# ``Inputs.waiting`` reads it). What comes after the fence writes only if it renewed, so a
# refused end writes nothing at all.
_PG_END_STEP = f"""
WITH {_PG_RENEWED_AS_READ}, {_PG_EVENTS}, {_pg_part_rows("renewed")}, message AS (
  UPDATE session_message SET data = %(body)s, time_updated = %(updated)s::bigint
  WHERE id = %(mid)s AND session_id = %(sid)s AND %(body)s::text IS NOT NULL
    AND EXISTS (SELECT 1 FROM allocated)
  RETURNING 1
), usage AS (
  UPDATE session
  SET cost = cost + %(cost)s::float8,
    steps_priced = steps_priced + %(priced)s::int,
    steps_unpriced = steps_unpriced + %(unpriced)s::int,
    tokens_input = tokens_input + %(input)s::bigint,
    tokens_output = tokens_output + %(output)s::bigint,
    tokens_reasoning = tokens_reasoning + %(reasoning)s::bigint,
    tokens_cache_read = tokens_cache_read + %(cache_read)s::bigint,
    tokens_cache_write = tokens_cache_write + %(cache_write)s::bigint,
    time_updated = %(at)s::bigint
  WHERE id = %(sid)s AND %(usage)s::boolean AND EXISTS (SELECT 1 FROM allocated)
  RETURNING 1
)
SELECT (SELECT seq FROM allocated) AS last,
  EXISTS (SELECT 1 FROM session_input WHERE session_id = %(sid)s AND type = 'prompt'
    AND delivery = 'steer' AND promoted_seq IS NULL) AS steer,
  EXISTS (SELECT 1 FROM session_input WHERE session_id = %(sid)s AND type = 'prompt'
    AND delivery = 'queue' AND promoted_seq IS NULL) AS queue,
  (SELECT id FROM session_input WHERE session_id = %(sid)s AND type = 'compaction'
    AND promoted_seq IS NULL LIMIT 1) AS compaction
"""


# A busy period's end as ``Store.end_execution`` reads it: the version of the session's claim
# row (as ``_PG_STEP_READ``), the session's latest assistant message without its parts (a
# terminal event ends a retry it announced), and whether the terminal is already written.
_PG_EXECUTION_READ = """
SELECT xmin::text,
  (SELECT data FROM session_message
   WHERE session_id = %(sid)s AND type = 'assistant' ORDER BY seq DESC LIMIT 1),
  EXISTS (SELECT 1 FROM event WHERE id = %(tid)s)
FROM session_execution WHERE session_id = %(sid)s
"""


def _pg_end_execution(release: bool) -> str:
    """A busy period's end (``Store.end_execution``): the fence, fenced on the claim row's
    version as read too, deletes the claim (``release``) or renews it; the terminal event at
    the next seq; the session's recoveries forgotten. A refused fence writes nothing."""
    fenced = fence_ctes(Fence(release=release, version=True))
    return f"""
WITH {fenced}, {_PG_ALLOCATED}, {_PG_INSERTED}, cleared AS (
  DELETE FROM session_recovery WHERE session_id = %(sid)s AND EXISTS (SELECT 1 FROM renewed)
  RETURNING 1
)
SELECT (SELECT seq FROM allocated) AS last, (SELECT count(*) FROM cleared) AS cleared
"""


_PG_END_EXECUTION = {release: _pg_end_execution(release) for release in (False, True)}


# A session's first claim since its last release, with what the claim starts (its
# ``execution.started``), in one statement (``Store.claim_at_once``): the claim at the epoch
# after the session's last, only where the session has no claim row (a live claim, an expired
# one to take over, or this execution's own take the general path) and the event is not
# written yet; its seqs and events; then the session's epoch, after the sequence row, as
# ``Claims.acquiring`` orders them. A claim row its snapshot sees, even one another transaction
# is renewing or releasing, sends it to the general path at once: only there does an acquisition
# wait for the row, and no longer than its lock timeout (then ``ClaimHeldError``, retried at the
# holder's expiry). What can still make it wait is a concurrent first claim not yet committed
# (its INSERT then waits for that one to commit or roll back), a statement's time.
_PG_CLAIM = f"""
WITH claimed AS (
  INSERT INTO session_execution (session_id, id, owner_id, epoch, phase, assistant_message_id,
    step_attempt, time_created, expires_at)
  SELECT %(sid)s::text, %(eid)s::text, %(owner)s::text, s.claim_epoch + 1, 'ready', NULL, 0,
    {_PG_NOW}, {_PG_NOW} + %(lease)s
  FROM session s
  WHERE s.id = %(sid)s::text
    AND NOT EXISTS (SELECT 1 FROM session_execution WHERE session_id = %(sid)s::text)
    AND NOT EXISTS (SELECT 1 FROM event WHERE id = ANY(%(ids)b::text[]))
  ON CONFLICT (session_id) DO NOTHING
  RETURNING epoch, expires_at
), {_pg_allocated("claimed")}, inserted AS (
  INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
  SELECT e.id, %(agg)s, a.seq - %(n)s + e.ord, e.created, e.type, e.data, %(eid)s::text, c.epoch
  FROM allocated a, claimed c,
       unnest(%(ids)b::text[], %(createds)b::bigint[], %(types)b::text[], %(datas)b::text[])
         WITH ORDINALITY AS e(id, created, type, data, ord)
  RETURNING seq
), epoch AS (
  UPDATE session SET claim_epoch = c.epoch FROM claimed c WHERE session.id = %(sid)s::text
  RETURNING 1
)
SELECT (SELECT seq FROM allocated) AS last, (SELECT epoch FROM claimed) AS epoch,
  (SELECT expires_at FROM claimed) AS expires_at, (SELECT count(*) FROM inserted) AS written
"""


class SqliteWriter:
    """Fenced appends on SQLite with as little framing as possible.

    The whole transaction (BEGIN IMMEDIATE, renew, allocate, insert, COMMIT) is one call into
    sqlite3. It runs right on the event loop when the write lock is free, because a thread
    hop costs as much as the transaction itself (~0.15 ms); that connection never waits for the
    lock (busy_timeout 0), so the loop cannot stall behind another process's write. When the
    lock is taken, the append goes to a writer thread whose connection waits for it.
    The caller holds the process's SQLite write lock, so this process never races itself.
    """

    def __init__(self, db: Database) -> None:
        database = make_url(db.url).database
        assert database, "the fast path needs a SQLite file"
        self.path = Path(database)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sessionflow-sqlite-writer")
        self._inline: sqlite3.Connection | None = None
        self._threaded: sqlite3.Connection | None = None

    def _connect(self, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in sqlite_pragmas(busy_timeout_ms):
            conn.execute(pragma)
        return conn

    async def append(
        self, fence: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> bool:
        """Run the fenced append; False if the fence refused it. ``on_commit`` runs at once
        after the commit: a cancelled append did not commit, or committed and announced."""
        if self._inline is None:
            self._inline = self._connect(0)
        try:
            last = _append(self._inline, fence, rows, None)
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                _raise_typed(error, rows)
            return await self._append_threaded(fence, rows, on_commit)
        except sqlite3.Error as error:
            _raise_typed(error, rows)
        if last is None:
            return False
        on_commit()
        return True

    async def _append_threaded(
        self, fence: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> bool:
        stop = threading.Event()

        async def run() -> bool:
            loop = asyncio.get_running_loop()
            try:
                last = await loop.run_in_executor(
                    self._executor, self._append_in_thread, fence, rows, stop
                )
            except sqlite3.Error as error:
                _raise_typed(error, rows)
            if last is None:
                return False
            on_commit()
            return True

        return await settled(run(), on_cancel=stop.set)

    def _append_in_thread(
        self, fence: dict[str, Any], rows: list[dict[str, Any]], stop: threading.Event
    ) -> int | None:
        if self._threaded is None:
            self._threaded = self._connect(_BUSY_SLICE_MS)
        return _append(self._threaded, fence, rows, stop)

    async def close(self) -> None:
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        if self._threaded is not None:
            conn, self._threaded = self._threaded, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


def _append(
    conn: sqlite3.Connection,
    fence: dict[str, Any],
    rows: list[dict[str, Any]],
    stop: threading.Event | None,
) -> int | None:
    """The append; None if the fence refused it, or if ``stop`` was set before the commit."""
    if not _begin(conn, stop):
        return None
    try:
        if conn.execute(_SQLITE_RENEW, fence).fetchone() is None:
            conn.execute("ROLLBACK")
            return None
        (last,) = conn.execute(
            _SQLITE_ALLOCATE, {"agg": rows[0]["aggregate_id"], "n": len(rows)}
        ).fetchone()
        first = last - len(rows) + 1
        for offset, row in enumerate(rows):
            row["seq"] = first + offset
        conn.executemany(_INSERT, rows)
        if stop is not None and stop.is_set():
            conn.execute("ROLLBACK")
            return None
        conn.execute("COMMIT")
        return int(last)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _begin(conn: sqlite3.Connection, stop: threading.Event | None) -> bool:
    """BEGIN IMMEDIATE; in the writer thread, waiting for the lock until ``stop`` or the busy
    timeout. False if stopped."""
    if stop is None:
        conn.execute("BEGIN IMMEDIATE")
        return True
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while not stop.is_set():
        try:
            conn.execute("BEGIN IMMEDIATE")
            return True
        except sqlite3.OperationalError as error:
            busy = "locked" in str(error) or "busy" in str(error)
            if not busy or time.monotonic() >= deadline:
                raise
    return False


class _Pool:
    """At most ``size`` autocommit connections, opened when needed, taken first come first served.

    A slot is held for the whole use of a connection and freed whatever became of it: a
    connection the database dropped is closed, and whoever takes its slot next opens a fresh
    one. (Counting open connections without waking anyone left the waiting appends blocked for
    good once the database had dropped every connection.)
    """

    def __init__(self, conninfo: str, size: int) -> None:
        self.conninfo = conninfo
        self.size = size
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._open: set[Connection] = set()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self._slots:
            conn = await self._take()
            try:
                yield conn
            finally:
                await self._give_back(conn)

    async def _take(self) -> Connection:
        while self._idle:
            conn = self._idle.pop()
            if _usable(conn):
                return conn
            await self._discard(conn)
        conn = await psycopg.AsyncConnection.connect(
            self.conninfo, autocommit=True, application_name="sessionflow-append"
        )
        self._open.add(conn)
        return conn

    async def _give_back(self, conn: Connection) -> None:
        if conn.closed or conn.broken or conn.info.transaction_status != IDLE:
            await self._discard(conn)
        else:
            self._idle.append(conn)

    async def _discard(self, conn: Connection) -> None:
        self._open.discard(conn)
        await conn.close()

    async def close(self) -> None:
        for conn in list(self._open):
            await self._discard(conn)
        self._idle.clear()


def _usable(conn: Connection) -> bool:
    """Whether an idle connection still looks alive, found without a round trip.

    An idle connection with something to read was told something while idle: nearly always
    that the server is closing it (a terminated backend, a shutdown, a restart).
    """
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (psycopg.Error, OSError, ValueError):
        return False


class PostgresWriter:
    """A few dedicated autocommit connections: the append is one statement, one round trip.
    The store's hot reads of one statement run here too (``fetch``), without SQLAlchemy.

    One statement is one transaction, so no BEGIN/COMMIT; a pooled SQLAlchemy connection
    would add a pre-ping and a reset round trip to every append.
    """

    def __init__(self, db: Database, *, size: int = 4) -> None:
        self.size = size
        self._pool = _Pool(db.psycopg_conninfo, size)

    async def append(
        self,
        fence: dict[str, Any],
        rows: list[dict[str, Any]],
        on_commit: OnCommit,
        *,
        parts: list[dict[str, Any]] | None = None,
    ) -> bool:
        """The fenced append, seqs assigned to ``rows``; False if the fence refused it.

        ``parts``: the rows of ``session_part`` the events change (``_PG_PARTS``), written in
        the same statement. ``on_commit`` runs right after the commit, as one unit with it; an
        append the database aborted as a conflict runs again (``retry_conflicts``).
        """
        params = {
            **fence,
            "agg": rows[0]["aggregate_id"],
            "n": len(rows),
            "ids": [row["id"] for row in rows],
            "createds": [row["created"] for row in rows],
            "types": [row["type"] for row in rows],
            "datas": [row["data"] for row in rows],
        }
        sql = _PG_APPEND
        if parts is not None:
            sql = _PG_PARTS
            params["mid"] = parts[0]["mid"] if parts else ""
            params["positions"] = [part["position"] for part in parts]
            params["call_ids"] = [part["call_id"] for part in parts]
            params["parts"] = [part["body"] for part in parts]
        row = await retry_conflicts(lambda: self._attempt(sql, params, rows, on_commit))
        return row is not None

    async def start_step(
        self, params: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> bool:
        """``_PG_START``, seqs assigned to ``rows``; False if the fence refused it or the log
        had moved (nothing written but the renewal)."""
        row = await retry_conflicts(lambda: self._attempt(_PG_START, params, rows, on_commit))
        return row is not None

    async def end_step(
        self, params: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> tuple[Any, ...] | None:
        """``_PG_END_STEP``, seqs assigned to ``rows``: its row (the last seq, then what waits
        to be promoted), or None if the fence refused it and nothing was written."""
        return await retry_conflicts(lambda: self._attempt(_PG_END_STEP, params, rows, on_commit))

    async def read_step(self, session_id: str, message_id: str) -> list[tuple[Any, ...]]:
        """``_PG_STEP_READ``'s rows."""
        return await self.fetch(_PG_STEP_READ, {"sid": session_id, "mid": message_id})

    async def fetch_prepared(
        self, statement: Prepared, params: dict[str, Any]
    ) -> list[tuple[Any, ...]]:
        """``statement`` (as PostgreSQL compiles it) read as ``fetch`` reads."""
        compiled = statement.compiled("postgresql")
        return await self.fetch(compiled.sql, {**compiled.defaults, **params})

    async def fetch(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """A read of one statement: its own snapshot, no transaction, no SQLAlchemy."""
        try:
            async with self._pool.connection() as conn:
                cursor = await conn.execute(sql, params, prepare=True)
                return await cursor.fetchall()
        except psycopg.Error as error:
            _raise_typed(error, [])

    async def read_execution(self, session_id: str, terminal_id: str) -> list[tuple[Any, ...]]:
        """``_PG_EXECUTION_READ``'s row (none when the session has no claim)."""
        return await self.fetch(_PG_EXECUTION_READ, {"sid": session_id, "tid": terminal_id})

    async def end_execution(
        self,
        params: dict[str, Any],
        rows: list[dict[str, Any]],
        on_commit: OnCommit,
        *,
        release: bool,
    ) -> bool:
        """``_PG_END_EXECUTION``, the seq assigned to ``rows``' one event; False if the fence
        refused it (nothing written)."""
        sql = _PG_END_EXECUTION[release]
        row = await retry_conflicts(lambda: self._attempt(sql, params, rows, on_commit))
        return row is not None

    async def claim(
        self, params: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> tuple[int, int] | None:
        """``_PG_CLAIM``: the new claim's (epoch, expiry), its seqs and epoch assigned to
        ``rows``; None if the session had a claim row or the events were written (nothing
        written)."""

        async def attempt() -> tuple[int, int] | None:
            try:
                async with self._pool.connection() as conn:
                    return await settled(_claimed(conn, params, rows, on_commit))
            except psycopg.Error as error:
                _raise_typed(error, rows)

        return await retry_conflicts(attempt)

    async def open_turn(self, params: dict[str, Any]) -> int | None:
        """``_PG_OPEN_TURN``: the request's count, or None if the fence refused it (nothing
        written)."""

        async def attempt() -> int | None:
            rows = await self.fetch(_PG_OPEN_TURN, params)
            return None if not rows or rows[0][0] is None else int(rows[0][0])

        return await retry_conflicts(attempt)

    async def _attempt(
        self, sql: str, params: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
    ) -> tuple[Any, ...] | None:
        try:
            # A cancellation while waiting for a connection stops the append; once the
            # statement is sent, it and its announcement finish together (``settled``).
            async with self._pool.connection() as conn:
                return await settled(_commit(conn, sql, params, rows, on_commit))
        except psycopg.Error as error:
            _raise_typed(error, rows)

    async def settle_part(
        self, params: dict[str, Any], row: dict[str, Any], on_commit: OnCommit
    ) -> bool:
        """``_PG_SETTLE``: the event ``row`` and its tool part's new state, fenced, in one
        round trip; False if the fence refused it or the part had changed (nothing written)."""

        async def attempt() -> int | None:
            try:
                async with self._pool.connection() as conn:
                    return await settled(_settle(conn, params, row, on_commit))
            except psycopg.Error as error:
                _raise_typed(error, [row])

        return await retry_conflicts(attempt) is not None

    async def read_decide_write(
        self,
        reads: Sequence[tuple[Prepared, dict[str, Any]]],
        decide: Callable[[list[list[tuple[Any, ...]]]], tuple[Sequence[Any], T]],
    ) -> T:
        """One transaction in two round trips: ``reads`` sent together (each its own statement,
        so each sees what the ones before it locked), ``decide`` from their rows, then the
        writes it returns, ``(Prepared, params)`` pairs, sent with the commit. Run again whole
        after a conflict."""

        async def attempt() -> T:
            try:
                async with self._pool.connection() as conn:
                    return await settled(_read_decide_write(conn, reads, decide))
            except psycopg.Error as error:
                _raise_typed(error, [])

        return await retry_conflicts(attempt)

    async def close(self) -> None:
        await self._pool.close()


async def _read_decide_write(
    conn: Connection,
    reads: Sequence[tuple[Prepared, dict[str, Any]]],
    decide: Callable[[list[list[tuple[Any, ...]]]], tuple[Sequence[Any], T]],
) -> T:
    async with conn.pipeline() as pipeline, conn.transaction():
        cursors = [await _send(conn, statement, params) for statement, params in reads]
        await pipeline.sync()
        rows = [await cursor.fetchall() for cursor in cursors]
        writes, result = decide(rows)
        for statement, params in writes:
            await _send(conn, statement, params)
    return result


async def _send(conn: Connection, statement: Prepared, params: dict[str, Any]) -> Any:
    compiled = statement.compiled("postgresql")
    return await conn.execute(compiled.sql, {**compiled.defaults, **params}, prepare=True)


async def _settle(
    conn: Connection, params: dict[str, Any], row: dict[str, Any], on_commit: OnCommit
) -> int | None:
    cursor = await conn.execute(_PG_SETTLE, params, prepare=True)
    result = await cursor.fetchone()
    if result is None or result[0] is None:
        return None
    seq = row["seq"] = int(result[0])
    on_commit()
    return seq


async def _claimed(
    conn: Connection, params: dict[str, Any], rows: list[dict[str, Any]], on_commit: OnCommit
) -> tuple[int, int] | None:
    cursor = await conn.execute(_PG_CLAIM, params, prepare=True)
    result = await cursor.fetchone()
    if result is None or result[0] is None:
        return None
    last, epoch, expires_at, _written = result
    for offset, row in enumerate(rows):
        row["seq"] = int(last) - len(rows) + 1 + offset
        row["epoch"] = int(epoch)
    on_commit()
    return int(epoch), int(expires_at)


async def _commit(
    conn: Connection,
    sql: str,
    params: dict[str, Any],
    rows: list[dict[str, Any]],
    on_commit: OnCommit,
) -> tuple[Any, ...] | None:
    """Run an append statement whose first column is the last seq it allocated; its row, or
    None when that is NULL (the fence refused it)."""
    cursor = await conn.execute(sql, params, prepare=True)
    result = await cursor.fetchone()
    if result is None or result[0] is None:
        return None
    last = int(result[0])
    for offset, row in enumerate(rows):
        row["seq"] = last - len(rows) + 1 + offset
    on_commit()
    return tuple(result)


def _raise_typed(error: BaseException, rows: list[dict[str, Any]]) -> NoReturn:
    """Raise the store's typed error for a driver error on the hot path (or the error);
    ``rows``: the events it was writing (none for a read)."""
    typed = (unique_violation_error(error, rows) if rows else None) or store_error(error)
    if typed is None:
        raise error
    raise typed from error
