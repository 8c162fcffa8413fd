"""The rate governor: one provider key's capacity, shared by every session and worker.

A key is a provider and an API key's identity (a digest, never the key). Before a model request
a session *takes* capacity: a stream slot, one of the minute's requests and an estimate of its
tokens; after it, it *gives back* what it did not use. Each take is one write transaction that
locks the key's row (SQLite: the writer's ``BEGIN IMMEDIATE``; PostgreSQL: ``FOR UPDATE``) and
decides on the database clock, so every worker sees one truth.

A take that cannot be served returns a ``Wait`` until a moment worth trying again; the caller
waits holding nothing (the workflow's timer) and asks again. Waiters are served in order of
arrival: a waiter that arrived later waits while an earlier one, still waiting, has not been
served. A rate-limit answer (``close``) holds every session of the key back until its
``Retry-After``. A session streams one turn at a time, so one session never holds more than one
slot of a key and cannot starve the others.

Minutes are fixed windows starting at the first take after the last one ended; a slot whose
worker died frees itself after ``stream_ms``, and a waiter not seen for ``waiter_ms`` has given
up (an interrupted session): neither blocks anyone for long.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from store.db import Database, Tx
from store.dialect import insert, now_ms
from store.schema import capacity_table, stream_table, waiter_table

_c, _s, _w = capacity_table.c, stream_table.c, waiter_table.c
WINDOW_MS = 60_000


@dataclass(frozen=True)
class RateLimits:
    """A key's limits; None: no limit of that kind."""

    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute
    streams: int | None = None  # requests streaming at once


@dataclass(frozen=True)
class Grant:
    key: str
    holder: str
    tokens: int  # what it took of the minute's tokens
    window_start: int


@dataclass(frozen=True)
class Wait:
    key: str
    until_ms: int  # database clock, epoch ms
    reason: str  # what it waits for, as a person reads it
    wait_ms: int = 0  # from the take, by the database clock


class Governor:
    def __init__(
        self, db: Database, *, poll_ms: int = 500, stream_ms: int = 600_000, waiter_ms: int = 5_000
    ) -> None:
        self.db = db
        self.poll_ms = poll_ms
        self.stream_ms = stream_ms
        self.waiter_ms = waiter_ms

    async def take(self, key: str, holder: str, tokens: int, limits: RateLimits) -> Grant | Wait:
        """A stream slot and ``tokens`` of the minute for ``holder``, or how long to wait."""
        async with self.db.write() as tx:
            now = await self._locked(tx, key)
            row = (await tx.conn.execute(sa.select(capacity_table).where(_c.key == key))).one()
            # A holder's earlier request (its worker died, or this is a re-run) is replaced.
            await tx.conn.execute(stream_table.delete().where(_s.key == key, _s.holder == holder))
            window, requests, used = int(row.window_start), int(row.requests), int(row.tokens)
            if now - window >= WINDOW_MS:
                window, requests, used = now, 0, 0
            arrived = await self._arrival(tx, key, holder, now)
            wait = await self._wait(
                tx,
                key,
                holder,
                arrived,
                now,
                window,
                requests,
                used,
                tokens,
                int(row.closed_until),
                limits,
            )
            if wait is not None:
                await self._queue(tx, key, holder, arrived, now)
                await self._window(tx, key, window, requests, used)
                until, reason = wait
                return Wait(key, until, reason, wait_ms=until - now)
            await tx.conn.execute(waiter_table.delete().where(_w.key == key, _w.holder == holder))
            stream = {"key": key, "holder": holder, "tokens": tokens, "window_start": window}
            stream["expires_at"] = now + self.stream_ms
            await tx.conn.execute(stream_table.insert().values(**stream))
            await self._window(tx, key, window, requests + 1, used + tokens)
            return Grant(key, holder, tokens, window)

    async def give_back(self, grant: Grant, used: int | None = None) -> None:
        """The request ended: its slot is free, and of the tokens it took, those it did not use
        (``used``: what the provider reported; None: keep the estimate) are the minute's again."""
        async with self.db.write() as tx:
            await self._locked(tx, grant.key)
            gone = stream_table.delete().where(_s.key == grant.key, _s.holder == grant.holder)
            ended = await tx.conn.execute(gone)  # the minute's count: its own minute only
            if ended.rowcount and used is not None and used != grant.tokens:
                change = capacity_table.update().where(
                    _c.key == grant.key, _c.window_start == grant.window_start
                )
                tokens = sa.func.max if self.db.dialect == "sqlite" else sa.func.greatest
                values = {"tokens": tokens(_c.tokens + (used - grant.tokens), 0)}
                await tx.conn.execute(change.values(**values))

    async def close(self, key: str, retry_after_ms: int) -> int:
        """A rate-limit answer: every session of ``key`` waits ``retry_after_ms`` from now
        (a later close never shortens an earlier one). Returns the moment it opens again."""
        async with self.db.write() as tx:
            now = await self._locked(tx, key)
            until = now + max(0, retry_after_ms)
            later = sa.case((_c.closed_until > until, _c.closed_until), else_=until)
            await tx.conn.execute(
                capacity_table.update().where(_c.key == key).values(closed_until=later)
            )
            closed = sa.select(_c.closed_until).where(_c.key == key)
            return int((await tx.conn.execute(closed)).scalar_one())

    async def state(self, key: str) -> dict[str, int]:
        """The key as it is now (for ``status`` and tests): the minute's counts, the slots in
        use, the waiters, and until when it is closed."""
        async with self.db.read(single=True) as conn:
            row = (await conn.execute(sa.select(capacity_table).where(_c.key == key))).first()
            streams = sa.select(sa.func.count()).select_from(stream_table).where(_s.key == key)
            waiters = sa.select(sa.func.count()).select_from(waiter_table).where(_w.key == key)
            found = {
                "streams": int((await conn.execute(streams)).scalar_one()),
                "waiters": int((await conn.execute(waiters)).scalar_one()),
            }
        if row is None:
            return {**found, "requests": 0, "tokens": 0, "closed_until": 0}
        counts = {"requests": int(row.requests), "tokens": int(row.tokens)}
        return {**found, **counts, "closed_until": int(row.closed_until)}

    # --- inside a take's transaction ----------------------------------------------------------

    async def _locked(self, tx: Tx, key: str) -> int:
        """The key's row, created if new and locked; stale slots and waiters cleared. Returns
        the database clock, read after the lock."""
        fresh = {"key": key, "window_start": 0, "requests": 0, "tokens": 0, "closed_until": 0}
        upsert = insert(self.db.dialect, capacity_table).values(**fresh)
        await tx.conn.execute(upsert.on_conflict_do_nothing(index_elements=[_c.key]))
        lock = sa.select(_c.key).where(_c.key == key).with_for_update()
        await tx.conn.execute(lock)
        now = int((await tx.conn.execute(sa.select(now_ms(self.db.dialect)))).scalar_one())
        await tx.conn.execute(stream_table.delete().where(_s.key == key, _s.expires_at <= now))
        stale = now - self.waiter_ms
        await tx.conn.execute(waiter_table.delete().where(_w.key == key, _w.seen < stale))
        return now

    async def _arrival(self, tx: Tx, key: str, holder: str, now: int) -> int:
        query = sa.select(_w.arrived).where(_w.key == key, _w.holder == holder)
        found = (await tx.conn.execute(query)).scalar()
        return now if found is None else int(found)

    async def _wait(
        self,
        tx: Tx,
        key: str,
        holder: str,
        arrived: int,
        now: int,
        window: int,
        requests: int,
        used: int,
        tokens: int,
        closed_until: int,
        limits: RateLimits,
    ) -> tuple[int, str] | None:
        """Until when and why the take must wait; None: it is served now."""
        if closed_until > now:
            return closed_until, "the provider answered rate-limited"
        ahead = (
            sa.select(sa.func.count())
            .select_from(waiter_table)
            .where(_w.key == key, _w.holder != holder, _w.arrived < arrived)
        )
        waiting = int((await tx.conn.execute(ahead)).scalar_one())
        if waiting:
            return now + self.poll_ms, f"{waiting} session(s) ahead"
        minute_over = window + WINDOW_MS
        if limits.rpm is not None and requests >= limits.rpm:
            return minute_over, f"{limits.rpm} requests per minute"
        if limits.tpm is not None and used > 0 and used + tokens > limits.tpm:
            return minute_over, f"{limits.tpm} tokens per minute"
        if limits.streams is not None:
            count = sa.select(sa.func.count()).select_from(stream_table).where(_s.key == key)
            if int((await tx.conn.execute(count)).scalar_one()) >= limits.streams:
                return now + self.poll_ms, f"{limits.streams} concurrent streams"
        return None

    async def _queue(self, tx: Tx, key: str, holder: str, arrived: int, now: int) -> None:
        ticket = {"key": key, "holder": holder, "arrived": arrived, "seen": now}
        upsert = insert(self.db.dialect, waiter_table).values(**ticket)
        upsert = upsert.on_conflict_do_update(
            index_elements=[_w.key, _w.holder], set_={"seen": now}
        )
        await tx.conn.execute(upsert)

    async def _window(self, tx: Tx, key: str, window: int, requests: int, used: int) -> None:
        values = {"window_start": window, "requests": requests, "tokens": used}
        await tx.conn.execute(capacity_table.update().where(_c.key == key).values(**values))
