"""The rate governor: one provider key's capacity, shared by every session and worker.

A key is a provider and an API key's identity (a digest, never the key). Before a model request
a session *takes* capacity: a stream slot, one of the minute's requests and an estimate of its
tokens; after it, it *gives back* what it did not use. Each take is one write transaction that
locks the key's row (SQLite: the writer's ``BEGIN IMMEDIATE``; PostgreSQL: the upsert that
reads it) and decides on the database clock read after that lock, so every worker sees one
truth. Its statements are built once; on PostgreSQL the take's reads go in one round trip and
its writes with the commit in another (``PostgresWriter.read_decide_write``).

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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from store.db import Database
from store.dialect import DialectName, insert, now_ms
from store.prepared import Prepared
from store.schema import capacity_table, stream_table, waiter_table

if TYPE_CHECKING:
    from store.write.fast import PostgresWriter

_c, _s, _w = capacity_table.c, stream_table.c, waiter_table.c
WINDOW_MS = 60_000
T = TypeVar("T")
Statement = tuple[Prepared, dict[str, Any]]
Rows = list[list[tuple[Any, ...]]]


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
    expires_at: int  # its slot's end, unless given back: tells it from a later take's


@dataclass(frozen=True)
class Wait:
    key: str
    until_ms: int  # database clock, epoch ms
    reason: str  # what it waits for, as a person reads it
    wait_ms: int = 0  # from the take, by the database clock


@dataclass(frozen=True)
class _Key:
    """The key's row and what else is on it, read under the row's lock."""

    window_start: int
    requests: int
    tokens: int
    closed_until: int
    now: int  # the database clock, read after the lock
    arrived: int | None  # when this holder began waiting, if it waits
    ahead: int  # live waiters that arrived before it
    streams: int  # other holders' live slots
    own_stream: bool  # an earlier request of this holder still holds a slot
    stale: bool  # dead slots or given-up waiters to clear

    @classmethod
    def of(cls, rows: Rows) -> _Key:
        ((window, requests, tokens, closed),), ((now, arrived, ahead, streams, own, stale),) = rows
        return cls(
            window_start=int(window),
            requests=int(requests),
            tokens=int(tokens),
            closed_until=int(closed),
            now=int(now),
            arrived=None if arrived is None else int(arrived),
            ahead=int(ahead),
            streams=int(streams),
            own_stream=bool(own),
            stale=bool(stale),
        )


def _bind(name: str) -> sa.BindParameter[Any]:
    # Prefixed: a bound parameter may not share an INSERT's or UPDATE's column name.
    return sa.bindparam(f"p_{name}")


def _p(**values: Any) -> dict[str, Any]:
    return {f"p_{name}": value for name, value in values.items()}


def _count(table: sa.Table, where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    return sa.select(sa.func.count()).select_from(table).where(where).scalar_subquery()


def _lock(dialect: DialectName) -> Any:
    """The key's row, created if new and locked: an upsert that always updates (PostgreSQL
    locks the row it conflicts with; SQLite's writer already holds the database)."""
    fresh = {"window_start": 0, "requests": 0, "tokens": 0, "closed_until": 0}
    upsert = insert(dialect, capacity_table).values(key=_bind("key"), **fresh)
    upsert = upsert.on_conflict_do_update(index_elements=[_c.key], set_={"key": _bind("key")})
    return upsert.returning(_c.window_start, _c.requests, _c.tokens, _c.closed_until)


def _facts(dialect: DialectName) -> Any:
    """What else is on the key, and the clock: its own statement after the lock, so on
    PostgreSQL its snapshot (and clock) is taken once the lock is held."""
    key, holder = _bind("key"), _bind("holder")
    clock = sa.select(now_ms(dialect).label("now")).cte("clock")
    now = clock.c.now
    mine = sa.select(_w.arrived).where(_w.key == key, _w.holder == holder).scalar_subquery()
    live = _w.seen >= now - _bind("waiter_ms")
    ahead = (_w.key == key) & (_w.holder != holder) & live
    ahead &= _w.arrived < sa.func.coalesce(mine, now)
    others = (_s.key == key) & (_s.holder != holder) & (_s.expires_at > now)
    own = (_s.key == key) & (_s.holder == holder)
    stale = _count(stream_table, (_s.key == key) & (_s.expires_at <= now)) + _count(
        waiter_table, (_w.key == key) & ~live
    )
    columns = (_count(waiter_table, ahead), _count(stream_table, others), _count(stream_table, own))
    return sa.select(now, mine, *columns, stale).select_from(clock)


def _stream(dialect: DialectName) -> Any:
    """The holder's slot, replacing an earlier request's."""
    slot = {name: _bind(name) for name in ("tokens", "window_start", "expires_at")}
    stream = insert(dialect, stream_table).values(key=_bind("key"), holder=_bind("holder"), **slot)
    return stream.on_conflict_do_update(index_elements=[_s.key, _s.holder], set_=slot)


def _queue(dialect: DialectName) -> Any:
    """The holder's place among the waiters: kept from its first arrival, seen now."""
    ticket = {"key": _bind("key"), "holder": _bind("holder"), "arrived": _bind("arrived")}
    upsert = insert(dialect, waiter_table).values(**ticket, seen=_bind("now"))
    return upsert.on_conflict_do_update(
        index_elements=[_w.key, _w.holder], set_={"seen": _bind("now")}
    )


def _unused(dialect: DialectName) -> Any:
    """Tokens a request took and did not use, the minute's again -- its own minute, and only
    while its slot is there (a give-back counts once)."""
    floor = sa.func.max if dialect == "sqlite" else sa.func.greatest
    slot = sa.exists().where(
        _s.key == _bind("key"),
        _s.holder == _bind("holder"),
        _s.expires_at == _bind("expires_at"),
    )
    return (
        capacity_table.update()
        .where(_c.key == _bind("key"), _c.window_start == _bind("window_start"), slot)
        .values(tokens=floor(_c.tokens + _bind("change"), 0))
    )


def _close(dialect: DialectName) -> Any:
    """Closed until ``after`` ms from now, unless already closed for longer."""
    until = now_ms(dialect) + _bind("after")
    later = sa.case((_c.closed_until > until, _c.closed_until), else_=until)
    return (
        capacity_table.update()
        .where(_c.key == _bind("key"))
        .values(closed_until=later)
        .returning(_c.closed_until)
    )


_LOCK = Prepared(_lock)
_FACTS = Prepared(_facts)
_STREAM = Prepared(_stream)
_QUEUE = Prepared(_queue)
_UNUSED = Prepared(_unused)
_CLOSE = Prepared(_close)
_WINDOW = Prepared(
    lambda _: (
        capacity_table.update()
        .where(_c.key == _bind("key"))
        .values(
            window_start=_bind("window_start"), requests=_bind("requests"), tokens=_bind("used")
        )
    )
)
_PRUNE_STREAMS = Prepared(
    lambda _: stream_table.delete().where(_s.key == _bind("key"), _s.expires_at <= _bind("now"))
)
_PRUNE_WAITERS = Prepared(
    lambda _: waiter_table.delete().where(_w.key == _bind("key"), _w.seen < _bind("seen_since"))
)
_DROP_STREAM = Prepared(
    lambda _: stream_table.delete().where(_s.key == _bind("key"), _s.holder == _bind("holder"))
)
_DROP_WAITER = Prepared(
    lambda _: waiter_table.delete().where(_w.key == _bind("key"), _w.holder == _bind("holder"))
)
_GIVE_BACK = Prepared(
    lambda _: stream_table.delete().where(
        _s.key == _bind("key"),
        _s.holder == _bind("holder"),
        _s.expires_at == _bind("expires_at"),
    )
)


class Governor:
    def __init__(
        self,
        db: Database,
        *,
        writer: PostgresWriter | None = None,
        poll_ms: int = 500,
        stream_ms: int = 600_000,
        waiter_ms: int = 5_000,
    ) -> None:
        self.db = db
        self.writer = writer  # PostgreSQL: the reads in one round trip, the writes in another
        self.poll_ms = poll_ms
        self.stream_ms = stream_ms
        self.waiter_ms = waiter_ms

    async def take(self, key: str, holder: str, tokens: int, limits: RateLimits) -> Grant | Wait:
        """A stream slot and ``tokens`` of the minute for ``holder``, or how long to wait."""
        ids = {"key": key, "holder": holder}
        reads = [(_LOCK, _p(key=key)), (_FACTS, _p(**ids, waiter_ms=self.waiter_ms))]

        def decide(rows: Rows) -> tuple[list[Statement], Grant | Wait]:
            return self._decide(_Key.of(rows), key, holder, tokens, limits)

        return await self._transact(reads, decide)

    def _decide(
        self, found: _Key, key: str, holder: str, tokens: int, limits: RateLimits
    ) -> tuple[list[Statement], Grant | Wait]:
        now, ids = found.now, {"key": key, "holder": holder}
        writes: list[Statement] = []
        window, requests, used = found.window_start, found.requests, found.tokens
        if now - window >= WINDOW_MS:
            window, requests, used = now, 0, 0
        if found.stale:  # slots of dead workers, waiters that gave up: nobody waits on them
            writes.append((_PRUNE_STREAMS, _p(key=key, now=now)))
            writes.append((_PRUNE_WAITERS, _p(key=key, seen_since=now - self.waiter_ms)))
        wait = self._wait(found, window, requests, used, tokens, limits)
        if wait is not None:
            if found.own_stream:  # a holder's earlier request (its worker died) is over
                writes.append((_DROP_STREAM, _p(**ids)))
            arrived = now if found.arrived is None else found.arrived
            writes.append((_QUEUE, _p(**ids, arrived=arrived, now=now)))
            if window != found.window_start:
                counts = _p(key=key, window_start=window, requests=requests, used=used)
                writes.append((_WINDOW, counts))
            until, reason = wait
            return writes, Wait(key, until, reason, wait_ms=until - now)
        if found.arrived is not None:
            writes.append((_DROP_WAITER, _p(**ids)))
        expires_at = now + self.stream_ms
        slot = _p(**ids, tokens=tokens, window_start=window, expires_at=expires_at)
        writes.append((_STREAM, slot))
        counts = _p(key=key, window_start=window, requests=requests + 1, used=used + tokens)
        writes.append((_WINDOW, counts))
        return writes, Grant(key, holder, tokens, window, expires_at)

    async def give_back(self, grant: Grant, used: int | None = None) -> None:
        """The request ended: its slot is free, and of the tokens it took, those it did not use
        (``used``: what the provider reported; None: keep the estimate) are the minute's again.
        A later request of the same holder (a re-run) keeps its own slot."""
        slot = _p(key=grant.key, holder=grant.holder, expires_at=grant.expires_at)
        writes: list[Statement] = []
        if used is not None and used != grant.tokens:  # the key's row first, as a take's
            change = _p(window_start=grant.window_start, change=used - grant.tokens)
            writes.append((_UNUSED, {**slot, **change}))
        writes.append((_GIVE_BACK, slot))
        await self._transact([], lambda _: (writes, None))

    async def close(self, key: str, retry_after_ms: int) -> int:
        """A rate-limit answer: every session of ``key`` waits ``retry_after_ms`` from now
        (a later close never shortens an earlier one). Returns the moment it opens again."""
        after = max(0, retry_after_ms)
        reads = [(_LOCK, _p(key=key)), (_CLOSE, _p(key=key, after=after))]
        return await self._transact(reads, lambda rows: ([], int(rows[1][0][0])))

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

    async def _transact(
        self, reads: list[Statement], decide: Callable[[Rows], tuple[list[Statement], T]]
    ) -> T:
        """``reads`` (the first locks the key's row), ``decide`` from their rows, then its
        writes: one transaction."""
        if self.writer is not None:
            return await self.writer.read_decide_write(reads, decide)
        dialect = self.db.dialect
        async with self.db.write() as tx:
            rows = [await statement.rows(tx.conn, dialect, params) for statement, params in reads]
            writes, result = decide(rows)
            for statement, params in writes:
                await statement.rows(tx.conn, dialect, params)
            return result

    def _wait(
        self, found: _Key, window: int, requests: int, used: int, tokens: int, limits: RateLimits
    ) -> tuple[int, str] | None:
        """Until when and why the take must wait; None: it is served now."""
        now = found.now
        if found.closed_until > now:
            return found.closed_until, "the provider answered rate-limited"
        if found.ahead:
            return now + self.poll_ms, f"{found.ahead} session(s) ahead"
        minute_over = window + WINDOW_MS
        if limits.rpm is not None and requests >= limits.rpm:
            return minute_over, f"{limits.rpm} requests per minute"
        if limits.tpm is not None and used > 0 and used + tokens > limits.tpm:
            return minute_over, f"{limits.tpm} tokens per minute"
        if limits.streams is not None and found.streams >= limits.streams:
            return now + self.poll_ms, f"{limits.streams} concurrent streams"
        return None
