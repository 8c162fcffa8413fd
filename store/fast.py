"""The hot path: fenced appends of events that have no projector (token deltas).

A turn streams most of its events as deltas, in short batches. Each batch is one fenced
transaction, so its cost is mostly framing: on SQLite every statement through aiosqlite is a
thread hop, on PostgreSQL every statement a round trip. This path does the same work as
``claims.fenced`` + ``events.publish_many`` -- renew the claim (database clock, same fence,
step attempt), reserve the seqs under the sequence row lock, insert the rows, queue the NOTIFY --
in one thread hop on SQLite (a dedicated connection on the process's writer lock) and in one
round trip on PostgreSQL (one statement, pipelined with BEGIN and COMMIT).
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy.engine import make_url

from store.db import SQLITE_BUSY_TIMEOUT_MS, Database, retry_conflicts
from store.dialect import store_error

IDLE = TransactionStatus.IDLE
_SQLITE_NOW = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
_SQLITE_RENEW = f"""
UPDATE session_execution
SET expires_at = {_SQLITE_NOW} + :lease, step_attempt = max(step_attempt, :attempt)
WHERE session_id = :sid AND id = :eid AND owner_id = :owner AND epoch = :epoch
  AND expires_at > {_SQLITE_NOW} AND (:attempt < 0 OR step_attempt <= :attempt)
RETURNING expires_at
"""
_SQLITE_ALLOCATE = """
INSERT INTO event_sequence (aggregate_id, seq) VALUES (:agg, :n - 1)
ON CONFLICT (aggregate_id) DO UPDATE SET seq = event_sequence.seq + :n
RETURNING seq
"""
_INSERT = """
INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
VALUES (:id, :aggregate_id, :seq, :created, :type, :data, :execution_id, :epoch)
"""

_PG_NOW = "floor(extract(epoch from clock_timestamp()) * 1000)::bigint"
_PG_APPEND = f"""
WITH renewed AS (
  UPDATE session_execution
  SET expires_at = {_PG_NOW} + %(lease)s, step_attempt = greatest(step_attempt, %(attempt)s)
  WHERE session_id = %(sid)s AND id = %(eid)s AND owner_id = %(owner)s AND epoch = %(epoch)s
    AND expires_at > {_PG_NOW} AND (%(attempt)s < 0 OR step_attempt <= %(attempt)s)
  RETURNING 1
), allocated AS (
  INSERT INTO event_sequence (aggregate_id, seq)
  SELECT %(agg)s, %(n)s - 1 FROM renewed
  ON CONFLICT (aggregate_id) DO UPDATE SET seq = event_sequence.seq + %(n)s
  RETURNING seq
), inserted AS (
  INSERT INTO event (id, aggregate_id, seq, created, type, data, execution_id, epoch)
  SELECT e.id, %(agg)s, a.seq - %(n)s + e.ord, e.created, e.type, e.data, %(eid)s, %(epoch)s
  FROM allocated a,
       unnest(%(ids)b::text[], %(createds)b::bigint[], %(types)b::text[], %(datas)b::text[])
         WITH ORDINALITY AS e(id, created, type, data, ord)
  RETURNING seq
)
SELECT (SELECT seq FROM allocated) AS last,
       pg_notify(%(channel)s, %(agg)s || ' ' || (SELECT max(seq) FROM inserted))
"""


class SqliteWriter:
    """Fenced appends on SQLite with as little framing as possible.

    The whole transaction (BEGIN IMMEDIATE, renew, allocate, insert, COMMIT) is one call into
    sqlite3. It runs right on the event loop when the write lock is free, because a thread
    hop costs as much as the transaction itself (~0.15 ms); that connection never waits for the
    lock (busy_timeout 0), so the loop cannot stall behind another process's write. When the
    lock is taken, the append goes to a writer thread whose connection waits (busy_timeout).
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
        for pragma in (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA busy_timeout={busy_timeout_ms}",
            "PRAGMA foreign_keys=ON",
            "PRAGMA synchronous=FULL",
        ):
            conn.execute(pragma)
        return conn

    async def append(self, fence: dict[str, Any], rows: list[dict[str, Any]]) -> int | None:
        """Run the fenced append; the last seq written, or None if the fence refused it."""
        if self._inline is None:
            self._inline = self._connect(0)
        try:
            return _append(self._inline, fence, rows)
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) and "busy" not in str(error):
                raise
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._append_threaded, fence, rows)

    def _append_threaded(self, fence: dict[str, Any], rows: list[dict[str, Any]]) -> int | None:
        if self._threaded is None:
            self._threaded = self._connect(SQLITE_BUSY_TIMEOUT_MS)
        return _append(self._threaded, fence, rows)

    async def close(self) -> None:
        if self._inline is not None:
            self._inline.close()
            self._inline = None
        if self._threaded is not None:
            conn, self._threaded = self._threaded, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)


def _append(
    conn: sqlite3.Connection, fence: dict[str, Any], rows: list[dict[str, Any]]
) -> int | None:
    conn.execute("BEGIN IMMEDIATE")
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
        conn.execute("COMMIT")
        return int(last)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class PostgresWriter:
    """A few dedicated autocommit connections: the append is one statement, one round trip.

    One statement is one transaction, so no BEGIN/COMMIT; a pooled SQLAlchemy connection
    would add a pre-ping and a reset round trip to every append.
    """

    def __init__(self, db: Database, *, size: int = 4) -> None:
        self.conninfo = db.psycopg_conninfo  # pinned isolation, bounded waits, search path
        self.size = size
        self._idle: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
        self._opened = 0
        self._all: list[psycopg.AsyncConnection[Any]] = []

    async def _checkout(self) -> psycopg.AsyncConnection[Any]:
        if self._idle.empty() and self._opened < self.size:
            self._opened += 1
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo, autocommit=True, application_name="sessionflow-append"
                )
            except BaseException:
                self._opened -= 1
                raise
            self._all.append(conn)
            return conn
        return await self._idle.get()

    async def append(
        self, fence: dict[str, Any], rows: list[dict[str, Any]], channel: str
    ) -> int | None:
        """The fenced append; the last seq written, or None if the fence refused it.

        One statement is one transaction: one the database aborted as a conflict runs again.
        """
        params = {
            **fence,
            "agg": rows[0]["aggregate_id"],
            "n": len(rows),
            "ids": [row["id"] for row in rows],
            "createds": [row["created"] for row in rows],
            "types": [row["type"] for row in rows],
            "datas": [row["data"] for row in rows],
            "channel": channel,
        }
        return await retry_conflicts(lambda: self._execute(params))

    async def _execute(self, params: dict[str, Any]) -> int | None:
        conn = await self._checkout()
        healthy = False
        try:
            cursor = await conn.execute(_PG_APPEND, params, prepare=True)
            row = await cursor.fetchone()
            healthy = True
        except psycopg.Error as error:
            typed = store_error(error)
            if typed is None:
                raise
            raise typed from error
        finally:
            if healthy or (not conn.closed and conn.info.transaction_status == IDLE):
                self._idle.put_nowait(conn)
            else:
                # A broken connection is dropped; the next append opens a fresh one.
                self._all.remove(conn)
                self._opened -= 1
                await conn.close()
        last = row[0] if row is not None else None
        return None if last is None else int(last)

    async def close(self) -> None:
        for conn in self._all:
            await conn.close()
        self._all.clear()
