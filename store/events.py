"""The event store (reference §2): an ordered, gap-free, per-aggregate log of typed events.

Every append is one transaction: the aggregate's sequence row is bumped (which locks it on
PostgreSQL, and SQLite write transactions are exclusive), projectors and the optional commit hook
run, and the event rows are inserted; all of it commits or none of it does (the doorbells, a
NOTIFY on PostgreSQL, ring after the commit: ``store.notify``). Because the sequence row stays
locked until commit, an aggregate's events commit in seq order, so a follower's cursor can
never skip an event that commits late.

Publishing is idempotent by event id: republishing an identical event returns the stored one
without projecting again (activity retries rely on this); a different event under a used id is
refused. Replay implements reference §2.4, owner fencing included.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, TypeVar

import sqlalchemy as sa

from sessionflow.errors import (
    InvalidDurableEventError,
    PayloadTooLargeError,
    SequenceConflictError,
    StoreError,
    StoreUnavailableError,
)
from sessionflow.ids import event_id, new_ids, validate_id
from sessionflow.models.events import Event
from store import codec
from store.db import Connection, Database, Stamp, Tx
from store.dialect import DialectName, for_update, insert, is_unique_violation
from store.notify import Notifier
from store.prepared import INTEGRITY_ERRORS, Prepared
from store.registry import EventRegistry
from store.schema import event_table, sequence_table
from store.write.allocation import allocation

log = logging.getLogger(__name__)
T = TypeVar("T")
# A following read that finds the database down waits this long, doubling up to the most.
_FOLLOW_FIRST_PAUSE_S = 0.05
_FOLLOW_MAX_PAUSE_S = 2.0

PAGE_SIZE = 512

Projector = Callable[[Tx, "StoredEvent"], Awaitable[None]]
CommitHook = Callable[[Tx, int], Awaitable[None]]
Listener = Callable[["StoredEvent"], None]


@dataclass(frozen=True)
class StoredEvent:
    """An event as committed: its place in the aggregate and the claim it was written under."""

    id: str
    aggregate_id: str
    seq: int
    created: int
    type: str
    data: Event
    execution_id: str | None = None
    epoch: int | None = None


@dataclass(frozen=True)
class Synced:
    """The ``log.synced`` marker: history up to ``seq`` was delivered (None for an empty log)."""

    aggregate_id: str
    seq: int | None
    type: Literal["log.synced"] = "log.synced"


@dataclass(frozen=True)
class SerializedEvent:
    """An event from elsewhere (another replica, a backup) to replay at a fixed position."""

    id: str
    type: str
    seq: int
    aggregate_id: str
    data: dict[str, Any]
    created: int | None = None


@dataclass(frozen=True)
class Page:
    events: list[StoredEvent]
    cursor: int


@dataclass(frozen=True)
class _Prepared:
    event: Event
    id: str
    explicit_id: bool
    created: int
    encoded: str

    @property
    def data(self) -> Any:
        return codec.loads(self.encoded)


class EventStore:
    def __init__(
        self,
        db: Database,
        notifier: Notifier,
        *,
        registry: EventRegistry | None = None,
        max_event_bytes: int = 4 * 1024 * 1024,
        page_size: int = PAGE_SIZE,
        poll_interval: float = 0.1,
    ) -> None:
        self.db = db
        self.notifier = notifier
        self.registry = registry or EventRegistry.sessions()
        self.max_event_bytes = max_event_bytes
        self.page_size = page_size
        self.poll_interval = poll_interval
        self._projectors: dict[type[Event], list[Projector]] = {}
        self._listeners: list[Listener] = []

    # --- registration ---------------------------------------------------------------------------

    def project(self, cls: type[Event], projector: Projector) -> None:
        """Run ``projector`` in the transaction of every ``cls`` event, in registration order."""
        self.registry.register(cls)
        self._projectors.setdefault(cls, []).append(projector)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` after each commit; its failures are logged, never raised."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # --- publish --------------------------------------------------------------------------------

    async def publish(
        self,
        event: Event,
        *,
        id: str | None = None,
        created: int | None = None,
        commit: CommitHook | None = None,
        tx: Tx | None = None,
    ) -> StoredEvent:
        prepared = self._prepare(event, id, created)
        if tx is not None:
            return (await self._append(tx, [prepared], commit))[0]
        return (await self.db.transact(lambda own: self._append(own, [prepared], commit)))[0]

    async def publish_many(
        self,
        events: Iterable[Event | tuple[Event, str]],
        *,
        tx: Tx | None = None,
        fresh_ids: Sequence[str] | None = None,
    ) -> list[StoredEvent]:
        """Append a batch atomically: every event or none (an invalid one refuses the batch).

        ``fresh_ids``: ids the caller drew for the events (its keys to find the batch again
        after an ambiguous commit), new, so not looked up as explicit ``(event, id)`` ids are.
        """
        prepared = [
            self._prepare(item[0], item[1], None)
            if isinstance(item, tuple)
            else self._prepare(item, None, None)
            for item in events
        ]
        if fresh_ids is not None:
            prepared = [replace(p, id=id) for p, id in zip(prepared, fresh_ids, strict=True)]
        if not prepared:
            return []
        if tx is not None:
            return await self._append(tx, prepared, None)
        return await self.db.transact(lambda own: self._append(own, prepared, None))

    def has_projector(self, cls: type[Event]) -> bool:
        return cls in self._projectors

    def projects_only(self, cls: type[Event], kinds: tuple[type[Event], ...]) -> bool:
        """Whether ``cls`` has no projector, or is one of ``kinds`` with one projector only."""
        projectors = self._projectors.get(cls, [])
        return not projectors or (issubclass(cls, kinds) and len(projectors) == 1)

    def prepare_rows(self, events: Sequence[Event], stamp: Stamp) -> list[dict[str, Any]]:
        """Validated, encoded rows for ``events`` (seq still to be assigned): the hot path.

        The same checks as ``publish``, once per batch where they can be: one id draw, one
        clock read, each aggregate validated once.
        """
        created = int(time.time() * 1000)
        ids = new_ids("evt", len(events))
        checked: set[str] = set()
        rows = []
        for event, id in zip(events, ids, strict=True):
            stored_type = event.stored_type()
            aggregate = getattr(event, event.aggregate_field, None)
            if aggregate not in checked:
                self._check(event, stored_type, aggregate)
                checked.add(str(aggregate))
            encoded = codec.dump_model(event)
            self._check_size(stored_type, encoded)
            rows.append(
                {
                    "id": id,
                    "aggregate_id": aggregate,
                    "seq": -1,
                    "created": created,
                    "type": stored_type,
                    "data": encoded,
                    "execution_id": stamp.execution_id,
                    "epoch": stamp.epoch,
                }
            )
        return rows

    def _check(self, event: Event, stored_type: str, aggregate: Any) -> None:
        if not self.registry.knows(stored_type):
            self.registry.register(type(event))
        if not isinstance(aggregate, str):
            raise InvalidDurableEventError(
                f"Expected string aggregate field {event.aggregate_field}", event_type=stored_type
            )
        validate_id(aggregate, "aggregate")

    def _check_size(self, stored_type: str, encoded: str) -> None:
        if len(encoded) * 4 > self.max_event_bytes:  # cheap bound before counting UTF-8 bytes
            size = len(encoded.encode("utf-8"))
            if size > self.max_event_bytes:
                raise PayloadTooLargeError(f"Event {stored_type}", size, self.max_event_bytes)

    def committed(self, rows: list[dict[str, Any]], events: Sequence[Event]) -> list[StoredEvent]:
        """The hot path committed ``rows``: ring doorbells and listeners, return the events."""
        stored = [
            StoredEvent(
                row["id"],
                row["aggregate_id"],
                row["seq"],
                row["created"],
                row["type"],
                event,
                row["execution_id"],
                row["epoch"],
            )
            for row, event in zip(rows, events, strict=True)
        ]
        self._announce(stored, publish=True)
        return stored

    def _prepare(self, event: Event, id: str | None, created: int | None) -> _Prepared:
        stored_type = event.stored_type()
        self._check(event, stored_type, getattr(event, event.aggregate_field, None))
        if id is not None:
            validate_id(id, "event")
        encoded = codec.dump_model(event)
        self._check_size(stored_type, encoded)
        return _Prepared(
            event=event,
            id=id or event_id(),
            explicit_id=id is not None,
            created=created if created is not None else int(time.time() * 1000),
            encoded=encoded,
        )

    async def _append(
        self, tx: Tx, batch: Sequence[_Prepared], commit: CommitHook | None
    ) -> list[StoredEvent]:
        existing = await self._existing_ids(tx.conn, [p.id for p in batch if p.explicit_id])
        fresh = [p for p in batch if p.id not in existing]
        results = {p.id: _same_or_refuse(existing[p.id], p) for p in batch if p.id in existing}
        last = await self._allocate(tx, Counter(p.event.aggregate_id for p in fresh))
        first = {agg: seq - n + 1 for agg, (seq, n) in last.items()}
        rows = []
        for p in fresh:
            agg = p.event.aggregate_id
            seq, first[agg] = first[agg], first[agg] + 1
            stored = StoredEvent(
                p.id,
                agg,
                seq,
                p.created,
                p.event.stored_type(),
                p.event,
                tx.stamp.execution_id if tx.stamp else None,
                tx.stamp.epoch if tx.stamp else None,
            )
            for projector in self._projectors.get(type(p.event), ()):
                await projector(tx, stored)
            if commit is not None:
                await commit(tx, seq)
            rows.append(_row(stored, p.encoded))
            results[p.id] = stored
        if rows:
            await self._insert(tx, rows)
            self._after_commit(tx, [results[p.id] for p in fresh], publish=True)
        return [results[p.id] for p in batch]

    async def _existing_ids(self, conn: Connection, ids: list[str]) -> dict[str, Any]:
        if not ids:
            return {}
        query = sa.select(event_table).where(event_table.c.id.in_(ids))
        return {row.id: row for row in (await conn.execute(query)).all()}

    async def _allocate(self, tx: Tx, counts: Counter[str]) -> dict[str, tuple[int, int]]:
        """Reserve ``n`` seqs per aggregate; returns the last reserved seq and ``n``.

        The sequence rows are locked in aggregate id order, whatever the batch's order: two
        batches over the same aggregates then wait for each other instead of deadlocking.
        """
        last: dict[str, tuple[int, int]] = {}
        for agg in sorted(counts):
            n = counts[agg]
            ((seq,),) = await _ALLOCATE.rows(tx.conn, tx.dialect, {"agg": agg, "n": n})
            last[agg] = (int(seq), n)
            tx.allocated[agg] = (int(seq), tx.allocated.get(agg, (0, 0))[1] + n)
        return last

    async def _insert(self, tx: Tx, rows: list[dict[str, Any]]) -> None:
        try:
            await _INSERT.many(tx.conn, tx.dialect, rows)
        except INTEGRITY_ERRORS as error:
            typed = unique_violation_error(error, rows)
            if typed is None:
                raise
            raise typed from error

    def _after_commit(self, tx: Tx, stored: list[StoredEvent], *, publish: bool) -> None:
        tx.after_commit.append(lambda: self._announce(stored, publish=publish))

    def _announce(self, stored: list[StoredEvent], *, publish: bool) -> None:
        """After a commit: ring the aggregates' doorbells (and other processes'), then tell
        the listeners."""
        latest: dict[str, int] = {}
        for event in stored:
            latest[event.aggregate_id] = max(event.seq, latest.get(event.aggregate_id, -1))
        for agg, seq in latest.items():
            self.notifier.committed(agg, seq)
        if publish:
            for event in stored:
                for listener in list(self._listeners):
                    try:
                        listener(event)
                    except Exception:
                        log.exception("Event listener failed")

    # --- replay ---------------------------------------------------------------------------------

    async def replay(
        self,
        serialized: SerializedEvent,
        *,
        publish: bool = False,
        owner_id: str | None = None,
        strict_owner: bool = False,
    ) -> StoredEvent | None:
        """Commit an event at its given position (reference §2.4); None when nothing was written."""
        event = self.registry.decode(serialized.type, serialized.data)
        aggregate = getattr(event, event.aggregate_field, None)
        if not isinstance(aggregate, str):
            raise InvalidDurableEventError(
                f"Expected string aggregate field {event.aggregate_field}"
            )
        if serialized.aggregate_id != aggregate:
            raise InvalidDurableEventError(
                f"Aggregate mismatch: expected {serialized.aggregate_id}, got {aggregate}"
            )
        prepared = self._prepare(event, serialized.id, serialized.created or 0)
        return await self.db.transact(
            lambda tx: self._replay(tx, prepared, serialized.seq, owner_id, strict_owner, publish)
        )

    async def _replay(
        self,
        tx: Tx,
        p: _Prepared,
        seq: int,
        owner: str | None,
        strict: bool,
        publish: bool,
    ) -> StoredEvent | None:
        agg = p.event.aggregate_id
        latest, stored_owner = await self._lock_sequence(tx, agg)
        if strict and stored_owner is not None and stored_owner != owner:
            raise InvalidDurableEventError(
                f"Replay owner mismatch for aggregate {agg}: "
                f"expected {stored_owner}, got {owner or 'none'}"
            )
        if seq <= latest:
            await self._check_identical(tx, p, seq)
            if owner is not None and stored_owner is None:
                await self._set_owner(tx, agg, owner)
            return None
        if stored_owner is not None and stored_owner != owner:
            return None
        if seq != latest + 1:
            raise InvalidDurableEventError(
                f"Sequence mismatch for aggregate {agg}: expected {latest + 1}, got {seq}"
            )
        used = await self._existing_ids(tx.conn, [p.id])
        if used:
            row = used[p.id]
            raise InvalidDurableEventError(
                f"Event {p.id} already exists at aggregate {row.aggregate_id} sequence {row.seq}"
            )
        stored = StoredEvent(p.id, agg, seq, p.created, p.event.stored_type(), p.event)
        for projector in self._projectors.get(type(p.event), ()):
            await projector(tx, stored)
        values: dict[str, Any] = {"seq": seq}
        if owner is not None and stored_owner is None:
            values["owner_id"] = owner
        await tx.conn.execute(
            sequence_table.update().where(sequence_table.c.aggregate_id == agg).values(**values)
        )
        await self._insert(tx, [_row(stored, p.encoded)])
        self._after_commit(tx, [stored], publish=publish)
        return stored

    async def _lock_sequence(self, tx: Tx, agg: str) -> tuple[int, str | None]:
        # A row with seq -1 stands for "no events yet" so that there is a row to lock.
        await tx.conn.execute(
            insert(tx.dialect, sequence_table)
            .values(aggregate_id=agg, seq=-1)
            .on_conflict_do_nothing(index_elements=[sequence_table.c.aggregate_id])
        )
        query = sa.select(sequence_table.c.seq, sequence_table.c.owner_id).where(
            sequence_table.c.aggregate_id == agg
        )
        row = (await tx.conn.execute(for_update(tx.dialect, query))).one()
        return int(row.seq), row.owner_id

    async def _check_identical(self, tx: Tx, p: _Prepared, seq: int) -> None:
        agg = p.event.aggregate_id
        query = sa.select(event_table).where(
            event_table.c.aggregate_id == agg, event_table.c.seq == seq
        )
        row = (await tx.conn.execute(query)).one_or_none()
        if (
            row is None
            or row.id != p.id
            or row.type != p.event.stored_type()
            or row.created != p.created
            or codec.loads(row.data) != p.data
        ):
            raise InvalidDurableEventError(f"Replay diverged at aggregate {agg} sequence {seq}")

    async def _set_owner(self, tx: Tx, agg: str, owner: str) -> None:
        await tx.conn.execute(
            sequence_table.update()
            .where(sequence_table.c.aggregate_id == agg)
            .values(owner_id=owner)
        )

    async def replay_all(
        self,
        events: Sequence[SerializedEvent],
        *,
        publish: bool = False,
        owner_id: str | None = None,
        strict_owner: bool = False,
    ) -> str | None:
        """Replay a contiguous run of one aggregate's events; returns the aggregate id."""
        if not events:
            return None
        aggregate, start = events[0].aggregate_id, events[0].seq
        if any(event.aggregate_id != aggregate for event in events):
            raise InvalidDurableEventError("Replay events must belong to the same aggregate")
        for index, event in enumerate(events):
            if event.seq != start + index:
                raise InvalidDurableEventError(
                    f"Replay sequence mismatch at index {index}: "
                    f"expected {start + index}, got {event.seq}"
                )
        for event in events:
            await self.replay(event, publish=publish, owner_id=owner_id, strict_owner=strict_owner)
        return aggregate

    # --- ownership and maintenance --------------------------------------------------------------

    async def claim(self, aggregate_id: str, owner_id: str) -> None:
        """Make ``owner_id`` the replication owner (last writer wins; no row is created)."""
        await self.db.transact(lambda tx: self._set_owner(tx, aggregate_id, owner_id))

    async def remove(self, aggregate_id: str) -> None:
        """Delete an aggregate's events and sequence; a replay may then start again at 0."""

        async def remove(tx: Tx) -> None:
            await tx.conn.execute(
                event_table.delete().where(event_table.c.aggregate_id == aggregate_id)
            )
            await tx.conn.execute(
                sequence_table.delete().where(sequence_table.c.aggregate_id == aggregate_id)
            )

        await self.db.transact(remove)

    async def reserve_sequence(self, aggregate_id: str, seq: int, *, tx: Tx | None = None) -> None:
        """Raise the aggregate's sequence to at least ``seq`` without events (used by fork)."""
        if tx is None:
            return await self.db.transact(
                lambda own: self.reserve_sequence(aggregate_id, seq, tx=own)
            )
        statement = insert(tx.dialect, sequence_table).values(aggregate_id=aggregate_id, seq=seq)
        await tx.conn.execute(
            statement.on_conflict_do_update(
                index_elements=[sequence_table.c.aggregate_id],
                set_={"seq": sa.func.max(sequence_table.c.seq, seq)}
                if tx.dialect == "sqlite"
                else {"seq": sa.func.greatest(sequence_table.c.seq, seq)},
            )
        )
        return None

    # --- reads ----------------------------------------------------------------------------------

    async def exists(self, aggregate_id: str, event_id: str) -> bool:
        """Whether ``event_id`` is stored: a writer whose commit lost its answer asks."""
        query = sa.select(event_table.c.id).where(
            event_table.c.aggregate_id == aggregate_id, event_table.c.id == event_id
        )
        async with self.db.read(single=True) as conn:
            return (await conn.execute(query)).first() is not None

    async def latest_sequence(self, aggregate_id: str) -> int:
        async with self.db.read(single=True) as conn:
            return await _latest(conn, aggregate_id)

    async def sequences(self, aggregate_ids: Iterable[str]) -> dict[str, int]:
        ids = list(aggregate_ids)
        if not ids:
            return {}
        query = sa.select(sequence_table.c.aggregate_id, sequence_table.c.seq).where(
            sequence_table.c.aggregate_id.in_(ids), sequence_table.c.seq >= 0
        )
        async with self.db.read(single=True) as conn:
            return {row.aggregate_id: int(row.seq) for row in (await conn.execute(query)).all()}

    async def read_after(
        self,
        aggregate_id: str,
        after: int = -1,
        *,
        through: int | None = None,
        limit: int | None = None,
        tx: Tx | None = None,
    ) -> Page:
        """One page of events with ``after < seq <= through`` in seq order (read in ``tx``
        when given).

        Rows of a type unknown to this process are skipped, but the cursor still advances.
        """
        query = (
            sa.select(event_table)
            .where(event_table.c.aggregate_id == aggregate_id, event_table.c.seq > after)
            .order_by(event_table.c.seq)
            .limit(limit or self.page_size)
        )
        if through is not None:
            query = query.where(event_table.c.seq <= through)
        async with self.db.reading(tx) as conn:
            rows = (await conn.execute(query)).all()
        events = [self._decode(row) for row in rows if self.registry.knows(row.type)]
        return Page(events, int(rows[-1].seq) if rows else after)

    async def latest_of(
        self, aggregate_id: str, cls: type[Event], *, tx: Tx | None = None
    ) -> StoredEvent | None:
        """The aggregate's latest event of type ``cls`` (None without one)."""
        query = (
            sa.select(event_table)
            .where(event_table.c.aggregate_id == aggregate_id)
            .where(event_table.c.type == cls.stored_type())
            .order_by(event_table.c.seq.desc())
            .limit(1)
        )
        async with self.db.reading(tx) as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else self._decode(row)

    async def first_of(
        self,
        aggregate_id: str,
        kinds: Sequence[type[Event]],
        *,
        after: int = -1,
        tx: Tx | None = None,
    ) -> StoredEvent | None:
        """The aggregate's first event of one of ``kinds`` with ``seq > after`` (None
        without one; read in ``tx`` when given)."""
        query = (
            sa.select(event_table)
            .where(event_table.c.aggregate_id == aggregate_id, event_table.c.seq > after)
            .where(event_table.c.type.in_([kind.stored_type() for kind in kinds]))
            .order_by(event_table.c.seq)
            .limit(1)
        )
        async with self.db.reading(tx) as conn:
            row = (await conn.execute(query)).first()
        return None if row is None else self._decode(row)

    async def all_of(
        self, aggregate_id: str, kinds: Sequence[type[Event]], *, tx: Tx | None = None
    ) -> list[StoredEvent]:
        """Every event of the aggregate of one of ``kinds``, in log order."""
        query = (
            sa.select(event_table)
            .where(event_table.c.aggregate_id == aggregate_id)
            .where(event_table.c.type.in_([kind.stored_type() for kind in kinds]))
            .order_by(event_table.c.seq)
        )
        async with self.db.reading(tx) as conn:
            rows = (await conn.execute(query)).all()
        return [self._decode(row) for row in rows]

    def _decode(self, row: Any) -> StoredEvent:
        return StoredEvent(
            id=row.id,
            aggregate_id=row.aggregate_id,
            seq=int(row.seq),
            created=int(row.created),
            type=row.type,
            data=self.registry.decode(row.type, codec.loads(row.data)),
            execution_id=row.execution_id,
            epoch=row.epoch,
        )

    async def log(
        self,
        aggregate_id: str,
        *,
        after: int = -1,
        follow: bool = False,
        poll_interval: float | None = None,
        ride_out: bool = True,
        on_outage: Callable[[str], None] | None = None,
    ) -> AsyncIterator[StoredEvent | Synced]:
        """History after ``after``, the ``log.synced`` marker, then (if following) live events.

        The doorbell is armed before the history snapshot is taken, so an event committed during
        the replay is delivered after the marker; the cursor only moves forward, so nothing is
        delivered twice. ``ride_out``: past its history, a follower waits out the database being
        unavailable (``_riding_out``); without it, the follow ends with the error (the API's
        feed: its streams end and their clients reconnect from their last id). ``on_outage``
        is told each failed read's reason instead of the log (a terminal's follower says so
        once, where a log line would land in the streamed text).
        """
        if not follow:
            async for item in self._history(aggregate_id, after):
                yield item
            return
        interval = self.poll_interval if poll_interval is None else poll_interval
        async with self.notifier.subscribe(aggregate_id) as bell:
            cursor = after
            async for item in self._history(aggregate_id, after):
                if isinstance(item, StoredEvent):
                    cursor = item.seq
                else:
                    cursor = max(cursor, item.seq if item.seq is not None else cursor)
                yield item
            while True:
                await bell.wait(interval)
                retrying = partial(_riding_out, on_outage=on_outage) if ride_out else _once
                latest = await retrying(partial(self.latest_sequence, aggregate_id))
                while cursor < latest:
                    read = partial(self.read_after, aggregate_id, cursor, through=latest)
                    page = await retrying(read)
                    for event in page.events:
                        yield event
                    cursor = page.cursor if page.cursor > cursor else latest

    async def _history(self, aggregate_id: str, after: int) -> AsyncIterator[StoredEvent | Synced]:
        target = await self.latest_sequence(aggregate_id)
        cursor = after
        while cursor < target:
            page = await self.read_after(aggregate_id, cursor, through=target)
            for event in page.events:
                yield event
            cursor = page.cursor if page.cursor > cursor else target
        yield Synced(aggregate_id, target if target >= 0 else None)


async def _once(read: Callable[[], Awaitable[T]]) -> T:
    return await read()


async def _riding_out(
    read: Callable[[], Awaitable[T]], *, on_outage: Callable[[str], None] | None = None
) -> T:
    """``read()``, again after a growing, jittered pause while the database is unavailable.

    A follower past its history outlives a database restart (C4): it keeps its cursor and
    carries on from it once the database is back, where it would otherwise end and leave its
    reader to start over. No bound: following is open-ended, and the listener reconnects
    without one too. A read that fails otherwise still ends the follow."""
    pause = _FOLLOW_FIRST_PAUSE_S
    while True:
        try:
            return await read()
        except StoreUnavailableError as error:
            if on_outage is not None:
                on_outage(error.reason)
            else:
                log.warning("Following: the database is unavailable, retrying: %s", error.reason)
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2 * pause, _FOLLOW_MAX_PAUSE_S)


def unique_violation_error(
    error: BaseException, rows: Sequence[dict[str, Any]]
) -> StoreError | None:
    """The typed error for a unique violation inserting event ``rows``, else None.

    A taken event id is a defect of the caller's ids; a taken (aggregate, seq) is a writer
    that bypassed the sequence row (catalogue S1): ``SequenceConflictError``, never a raw 23505.
    """
    if not is_unique_violation(error):
        return None
    first = rows[0]
    text = str(getattr(error, "orig", error))
    if "pk_event" in text or "event.id" in text:
        return InvalidDurableEventError(
            f"Event {first['id']} already exists (committed concurrently); "
            f"retry the publish to get the stored event"
        )
    # PostgreSQL names the taken key; on the hot path the batch's seqs are assigned in SQL.
    taken = re.search(r"\(aggregate_id, seq\)=\([^,]+, (\d+)\)", text)
    return SequenceConflictError(first["aggregate_id"], int(taken[1]) if taken else first["seq"])


def _allocate_statement(dialect: DialectName) -> Any:
    return allocation(dialect)


_ALLOCATE = Prepared(_allocate_statement)
_INSERT = Prepared(lambda _dialect: event_table.insert())


async def _latest(conn: Connection, aggregate_id: str) -> int:
    query = sa.select(sequence_table.c.seq).where(sequence_table.c.aggregate_id == aggregate_id)
    seq = (await conn.execute(query)).scalar_one_or_none()
    return int(seq) if seq is not None else -1


def _row(stored: StoredEvent, encoded: str) -> dict[str, Any]:
    return {
        "id": stored.id,
        "aggregate_id": stored.aggregate_id,
        "seq": stored.seq,
        "created": stored.created,
        "type": stored.type,
        "data": encoded,
        "execution_id": stored.execution_id,
        "epoch": stored.epoch,
    }


def _same_or_refuse(row: Any, p: _Prepared) -> StoredEvent:
    if (
        row.aggregate_id == p.event.aggregate_id
        and row.type == p.event.stored_type()
        and codec.loads(row.data) == p.data
    ):
        return StoredEvent(
            row.id,
            row.aggregate_id,
            int(row.seq),
            int(row.created),
            row.type,
            p.event,
            row.execution_id,
            row.epoch,
        )
    raise InvalidDurableEventError(
        f"Event {p.id} already exists at aggregate {row.aggregate_id} sequence {row.seq}",
        event_type=p.event.stored_type(),
    )
