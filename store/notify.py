"""Doorbells for followers: in-process rings, PostgreSQL LISTEN/NOTIFY, polling as the floor.

A doorbell carries no data: a follower that hears it re-reads the table from its cursor, so a
lost, late or coalesced ring can delay an event but never lose or repeat one. Commits in this
process ring their aggregate's doorbells after commit. On PostgreSQL one LISTEN connection per
process hears commits of every process on the fixed channel; when that connection dies it
reconnects with backoff and rings every doorbell, because notifications sent meanwhile are lost.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

import psycopg

from store.dialect import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


class Doorbell:
    """A sliding doorbell of capacity one: many rings coalesce into one pending wake."""

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        self._rung.set()

    async def wait(self, seconds: float) -> bool:
        """Wait for a ring or ``seconds``; True if it rang. Clears the ring either way."""
        try:
            await asyncio.wait_for(self._rung.wait(), seconds)
            return True
        except TimeoutError:
            return False
        finally:
            self._rung.clear()


class Notifier:
    """Per-process registry of doorbells, plus the PostgreSQL listener when there is one."""

    def __init__(self, conninfo: str | None = None) -> None:
        self._bells: defaultdict[str, set[Doorbell]] = defaultdict(set)
        self._conninfo = conninfo
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self.reconnects = 0
        self.listener_pid: int | None = None

    @asynccontextmanager
    async def subscribe(self, aggregate_id: str) -> AsyncIterator[Doorbell]:
        """Arm a doorbell for ``aggregate_id``; on PostgreSQL, only once LISTEN is active."""
        bell = Doorbell()
        self._bells[aggregate_id].add(bell)
        try:
            if self._conninfo is not None:
                self._ensure_listener()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._listening.wait(), 5)
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
        if self._listener is not None:
            self._listener.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._listener
            self._listener = None
