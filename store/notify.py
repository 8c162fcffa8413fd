"""Doorbells for followers: in-process rings, PostgreSQL LISTEN/NOTIFY, polling as the floor.

A doorbell carries no data: a follower that hears it re-reads the table from its cursor, so a
lost, late or coalesced ring can delay an event but never lose or repeat one. Commits in this
process ring their aggregate's doorbells after commit. On PostgreSQL one LISTEN connection per
process hears commits of every process on the fixed channel; when that connection dies it
reconnects with backoff and rings every doorbell, because notifications sent meanwhile are lost.

Other processes are told after the commit too, never inside the write: a transaction that
NOTIFYs takes PostgreSQL's cluster-wide notify lock through its commit, so notifying commits
run one at a time (measured: about half the commits per second of silent ones). The
``Announcer`` sends, on a connection of its own and at most once per ``ANNOUNCE_GAP_S``, one
statement for every aggregate committed since its last send, with that aggregate's latest
seq: rings coalesce per aggregate, and a write that did not commit (a fenced-out append) sends
nothing. A send is bounded (``SEND_TIMEOUT_S``); one that fails (its connection was closed, say)
is sent again at once on a fresh connection, and if that fails too its rings wait for the next
send, after a backoff: a follower in another process never waits for its poll because one
connection died.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import psycopg

from store.dialect import NOTIFY_CHANNEL

log = logging.getLogger(__name__)

_ANNOUNCE = "SELECT pg_notify(%s, payload) FROM unnest(%s::text[]) AS payload"
# A third of the default batch interval (SESSIONFLOW_BATCH_MS, 30 ms): what a follower in another
# process may wait at most, under load only, beyond the commit.
ANNOUNCE_GAP_S = 0.01
# The longest one send may take: a server that accepts and never answers must not hold the rings.
SEND_TIMEOUT_S = 2.0
_SEND_FAILURES = (psycopg.Error, OSError, TimeoutError)


class Doorbell:
    """A sliding doorbell of capacity one: many rings coalesce into one pending wake."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        self._rung.set()

    async def wait(self, seconds: float) -> bool:
        """Wait for a ring or ``seconds``; True if it rang. Clears the ring either way."""
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that
            # arrives as the ring does, and a follower being stopped would follow on forever.
            async with asyncio.timeout(seconds):
                await self._rung.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._rung.clear()


class Announcer:
    """Tells other processes (PostgreSQL NOTIFY) what this one committed, after the commit.

    Sends are at least ``gap`` seconds apart: rings within it wait and go together. A busy
    worker commits every few milliseconds, and each send is a statement on this connection
    and a commit that takes PostgreSQL's notify lock; an idle one rings far less often than
    that, so its followers hear each commit at once.
    """

    def __init__(self, conninfo: str, *, gap: float = ANNOUNCE_GAP_S) -> None:
        self._conninfo = conninfo
        self._gap = gap
        self._last_send = -math.inf
        self._pending: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.sent = 0  # notifications sent (one per aggregate per send)
        self.pid: int | None = None  # the backend that sends them

    def announce(self, aggregate_id: str, seq: int) -> None:
        """``aggregate_id`` committed up to ``seq``: notify soon (coalesced), never now."""
        if seq > self._pending.get(aggregate_id, -1):
            self._pending[aggregate_id] = seq
        self._wake.set()
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_forever(), name="store-announcer")

    async def _send_forever(self) -> None:
        delay = 0.05
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            early = self._last_send + self._gap - loop.time()
            if early > 0:
                await asyncio.sleep(early)
            self._wake.clear()
            self._last_send = loop.time()
            pending, self._pending = self._pending, {}
            payloads = [f"{agg} {seq}" for agg, seq in pending.items()]
            try:
                try:
                    await self._send(payloads)
                except _SEND_FAILURES:
                    await self._drop()
                    await self._send(payloads)  # once more, on a fresh connection
                delay = 0.05
            except asyncio.CancelledError:
                self._requeue(pending)  # closing: ``close`` sends them (a ring twice is harmless)
                raise
            except _SEND_FAILURES as error:
                log.warning("Could not notify followers, will retry: %s", error)
                await self._drop()
                self._requeue(pending)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    def _requeue(self, pending: dict[str, int]) -> None:
        """Rings a failed send did not deliver, for the next send (newer rings win)."""
        for aggregate_id, seq in pending.items():
            if seq > self._pending.get(aggregate_id, -1):
                self._pending[aggregate_id] = seq
        self._wake.set()

    async def _send(self, payloads: list[str]) -> None:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, application_name="sessionflow-announcer"
                )
                self.pid = self._conn.info.backend_pid
            await self._conn.execute(_ANNOUNCE, [NOTIFY_CHANNEL, payloads], prepare=True)
        self.sent += len(payloads)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        """Stop, after sending what is still to be told (one bounded try): a process that
        commits and exits at once (a CLI call admitting a prompt) still rings the followers
        of other processes, which would otherwise wait for their poll."""
        if self._sender is not None:
            self._sender.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._sender
            self._sender = None
        if self._pending:
            pending, self._pending = self._pending, {}
            try:
                await self._send([f"{agg} {seq}" for agg, seq in pending.items()])
            except _SEND_FAILURES as error:
                log.warning("Could not notify followers before closing: %s", error)
        await self._drop()


class Notifier:
    """Per-process registry of doorbells, plus the PostgreSQL listener and announcer when
    there is one."""

    def __init__(self, conninfo: str | None = None) -> None:
        self._bells: defaultdict[str, set[Doorbell]] = defaultdict(set)
        self._conninfo = conninfo
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self.reconnects = 0
        self.listener_pid: int | None = None
        self.announcer = Announcer(conninfo) if conninfo is not None else None

    def committed(self, aggregate_id: str, seq: int) -> None:
        """After a commit in this process: ring here, and tell the other processes."""
        self.ring(aggregate_id)
        if self.announcer is not None:
            self.announcer.announce(aggregate_id, seq)

    @asynccontextmanager
    async def subscribe(self, aggregate_id: str) -> AsyncIterator[Doorbell]:
        """Arm a doorbell for ``aggregate_id``; on PostgreSQL, only once LISTEN is active."""
        bell = Doorbell()
        self._bells[aggregate_id].add(bell)
        try:
            if self._conninfo is not None:
                self._ensure_listener()
                with suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await self._listening.wait()
            yield bell
        finally:
            bells = self._bells.get(aggregate_id)
            if bells is not None:
                bells.discard(bell)
                if not bells:
                    del self._bells[aggregate_id]

    def ring(self, aggregate_id: str) -> None:
        for bell in self._bells.get(aggregate_id, ()):
            bell.ring()

    def ring_all(self) -> None:
        for bells in self._bells.values():
            for bell in bells:
                bell.ring()

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen_forever(), name="store-listener")

    async def _listen_forever(self) -> None:
        assert self._conninfo is not None
        delay = 0.05
        while True:
            try:
                await self._listen_once(self._conninfo)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("Event listener connection lost, reconnecting: %s", error)
            self._listening.clear()
            self.reconnects += 1
            # Jittered backoff: many workers must not hammer a database that just restarted.
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)

    async def _listen_once(self, conninfo: str) -> None:
        async with await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, application_name="sessionflow-listener"
        ) as conn:
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            self.listener_pid = conn.info.backend_pid
            self._listening.set()
            # Anything committed while we were not listening is found by re-reading.
            self.ring_all()
            async for note in conn.notifies():
                aggregate_id, _, _seq = note.payload.partition(" ")
                self.ring(aggregate_id)

    async def close(self) -> None:
        if self.announcer is not None:
            await self.announcer.close()
        if self._listener is not None:
            self._listener.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
