"""``open_store``: one object with the database, event store, claims, inputs and sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from opentelemetry import trace

from sessionflow.errors import StoreUnavailableError
from sessionflow.ids import new_ids
from sessionflow.models import events as ev
from sessionflow.models.events import Event
from sessionflow.models.messages import AssistantMessage
from sessionflow.settings import Settings
from store import projector
from store.blobs import Blobs
from store.claims import Claim, Claims, fence_params
from store.db import Database, Pools, Stamp, Tx
from store.events import EventStore, StoredEvent
from store.governor import Governor
from store.hosts import Hosts
from store.inputs import Inputs
from store.notify import Notifier
from store.sessions import Sessions, StepBasis
from store.tool_runs import ToolRuns
from store.write.fast import PostgresWriter, SqliteWriter
from store.write.writes import Writes, batch_params

R = TypeVar("R")
B = TypeVar("B")
_tracer = trace.get_tracer("sessionflow.store")


@dataclass
class TurnView:
    """The assistant message a turn streams into, as the turn's own appends left it.

    The turn's writer keeps it between its batches, so that on PostgreSQL a batch that changes
    only the message's parts (``projector.parts_only``) is projected here and written with its
    events in one statement, without reading the message again. Any other batch, or a batch
    that fails, forgets it: the next one reads the message from the store again.
    """

    message_id: str
    message: AssistantMessage | None = None
    # What the turn's opening found the step would start on: its first batch, which starts
    # the step, is written on it in one statement (``_append_start``) unless the log moved.
    basis: StepBasis | None = None


@dataclass
class Store(Writes):
    db: Database
    notifier: Notifier
    events: EventStore
    claims: Claims
    inputs: Inputs
    sessions: Sessions
    hosts: Hosts
    writer: SqliteWriter | PostgresWriter | None = field(default=None)
    tool_runs: ToolRuns = field(default_factory=ToolRuns)
    governor: Governor = field(init=False)  # the provider keys' shared capacity
    blobs: Blobs = field(init=False)  # the content the file-change journal keeps

    def __post_init__(self) -> None:
        pipelined = self.writer if isinstance(self.writer, PostgresWriter) else None
        self.governor = Governor(self.db, writer=pipelined)
        self.blobs = Blobs(self.db)

    async def append(
        self,
        claim: Claim,
        events: Sequence[Event],
        *,
        step_attempt: int | None = None,
        view: TurnView | None = None,
    ) -> list[StoredEvent]:
        """Append ``events`` in one fenced transaction under ``claim``.

        Batches of one aggregate's projector-free events (token deltas) take the hot path in
        ``store.write.fast``, and so, on PostgreSQL with a turn's ``view``, do batches that
        change only that message's parts; anything else is ``claims.fenced`` +
        ``events.publish_many``. All refuse with ``ClaimLostError`` (or ``StaleAttemptError``)
        and write nothing.
        """
        if not events:
            return []
        attributes: dict[str, str | int] = {"session.id": claim.session_id, "events": len(events)}
        with _tracer.start_as_current_span("store.append", attributes=attributes):
            return await self._append(claim, events, step_attempt, view)

    async def _append(
        self,
        claim: Claim,
        events: Sequence[Event],
        step_attempt: int | None,
        view: TurnView | None,
    ) -> list[StoredEvent]:
        # The batch's ids are drawn once: they find it again if its commit is ambiguous.
        ids = new_ids("evt", len(events))
        try:
            return await self._append_once(claim, events, ids, step_attempt, view)
        except StoreUnavailableError:
            # The connection failed, perhaps after the commit (catalogue C2): once more, as
            # a fenced publish under the same ids, which returns the batch as stored (its
            # original seqs) if it committed, and writes it whole if it did not.
            keyed = list(zip(events, ids, strict=True))
            return await self._append_fenced(claim, keyed, None, step_attempt)

    async def _append_once(
        self,
        claim: Claim,
        events: Sequence[Event],
        ids: list[str],
        step_attempt: int | None,
        view: TurnView | None,
    ) -> list[StoredEvent]:
        message = basis = None
        if view is not None and isinstance(self.writer, PostgresWriter):
            message, view.message = view.message, None  # forgotten unless this batch commits
            basis, view.basis = view.basis, None  # the first batch's alone: it moves the log
        else:
            view = None  # SQLite's general path runs inline: a view saves it nothing
        projected = any(self.events.has_projector(type(e)) for e in events)
        one_aggregate = {e.aggregate_id for e in events} == {claim.session_id}
        started = None
        if view is not None and basis is not None and one_aggregate:
            started = await self._append_start(claim, events, ids, step_attempt, view, basis)
        if started is not None:
            stored, message = started
        elif (
            view is not None
            and message is not None
            and one_aggregate
            and self._parts_only(message, events)
        ):
            stored = await self._append_parts(claim, events, ids, step_attempt, message)
        elif projected or len({e.aggregate_id for e in events}) > 1:
            captured: list[AssistantMessage] | None = None if view is None else []
            stored = await self._append_fenced(claim, events, ids, step_attempt, captured)
            message = captured[-1] if captured else None
        else:
            stored = await self._append_hot(claim, events, ids, step_attempt)
        if view is not None:
            view.message = message
        return stored

    def _parts_only(self, message: AssistantMessage, events: Sequence[Event]) -> bool:
        """Whether ``events`` change only parts of ``message`` that a turn alone writes."""
        kinds = projector.PART_EVENTS
        return all(self.events.projects_only(type(e), kinds) for e in events) and (
            projector.parts_only(message, events)
        )

    async def _append_hot(
        self, claim: Claim, events: Sequence[Event], ids: list[str], step_attempt: int | None
    ) -> list[StoredEvent]:
        """Projector-free events of one aggregate (deltas): the hot path's one transaction."""
        rows = self._rows(claim, events, ids)
        fence = {**fence_params(claim), "attempt": -1 if step_attempt is None else step_attempt}
        stored: list[StoredEvent] = []

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            stored.extend(self.events.committed(rows, events))

        if isinstance(self.writer, SqliteWriter):
            async with self.db.serialized():
                appended = await self.writer.append(fence, rows, announce)
        else:
            assert self.writer is not None
            appended = await self.writer.append(fence, rows, announce)
        if not appended:
            raise await self.claims.why_lost(claim, step_attempt)
        return stored

    async def _append_parts(
        self,
        claim: Claim,
        events: Sequence[Event],
        ids: list[str],
        step_attempt: int | None,
        message: AssistantMessage,
    ) -> list[StoredEvent]:
        """``_PG_PARTS``: the batch projected on ``message`` (the turn's view) and written with
        the parts it changed in one statement."""
        assert isinstance(self.writer, PostgresWriter)
        rows = self._rows(claim, events, ids)
        placed = [
            StoredEvent(row["id"], row["aggregate_id"], -1, row["created"], row["type"], event)
            for row, event in zip(rows, events, strict=True)
        ]
        parts = await projector.project_parts(message, placed)
        fence = {**fence_params(claim), "attempt": -1 if step_attempt is None else step_attempt}
        stored: list[StoredEvent] = []

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            stored.extend(self.events.committed(rows, events))

        if not await self.writer.append(fence, rows, announce, parts=parts):
            raise await self.claims.why_lost(claim, step_attempt)
        return stored

    async def _append_start(
        self,
        claim: Claim,
        events: Sequence[Event],
        ids: list[str],
        step_attempt: int | None,
        view: TurnView,
        basis: StepBasis,
    ) -> tuple[list[StoredEvent], AssistantMessage] | None:
        """``_PG_START``: a turn's batch that starts its step, on what the turn's opening read
        (``basis``): the step's message built here and the batch projected on it, written with
        the events in one statement while the session's log has not moved. None when this
        does not apply, or the log moved, or the fence refused it: the general path then
        writes the batch from what it reads (or says why it cannot)."""
        if not self._starts_on(basis, view.message_id, events):
            return None
        assert isinstance(self.writer, PostgresWriter)
        rows = self._rows(claim, events, ids)
        for offset, row in enumerate(rows):  # the statement writes them there or not at all
            row["seq"] = basis.seq + 1 + offset
        start = events[0]
        assert isinstance(start, ev.StepStarted)
        message = projector.step_message(start, rows[0]["seq"], rows[0]["created"])
        if not self._parts_only(message, events[1:]):
            return None
        placed = [
            StoredEvent(row["id"], row["aggregate_id"], row["seq"], row["created"], row["type"], e)
            for row, e in zip(rows[1:], events[1:], strict=True)
        ]
        parts = (await projector.project_in_memory(message, placed)).parts
        params = {
            **batch_params(claim, rows, parts, step_attempt),
            "expected": basis.seq,
            "mid": message.id,
            "message_seq": message.seq,
            "created": rows[0]["created"],
            "body": projector.message_row(message),
        }
        stored: list[StoredEvent] = []

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            stored.extend(self.events.committed(rows, events))

        if not await self.writer.start_step(params, rows, announce):
            return None
        return stored, message

    def _starts_on(self, basis: StepBasis, message_id: str, events: Sequence[Event]) -> bool:
        """Whether ``events`` start the step of ``message_id`` afresh on ``basis``: no message
        of that id yet (a retry re-announces its own), none left incomplete to supersede."""
        start = events[0]
        return (
            isinstance(start, ev.StepStarted)
            and start.assistant_message_id == message_id
            and self.events.projects_only(ev.StepStarted, (ev.StepStarted,))
            and not basis.exists
            and not projector.supersedes(basis.latest)
        )

    def _rows(self, claim: Claim, events: Sequence[Event], ids: list[str]) -> list[dict[str, Any]]:
        rows = self.events.prepare_rows(events, Stamp(claim.execution_id, claim.epoch))
        for row, id in zip(rows, ids, strict=True):
            row["id"] = id
        return rows

    async def _append_fenced(
        self,
        claim: Claim,
        events: Sequence[Event | tuple[Event, str]],
        fresh_ids: list[str] | None,
        step_attempt: int | None,
        captured: list[AssistantMessage] | None = None,
    ) -> list[StoredEvent]:
        """``claims.fenced`` + ``events.publish_many``. ``captured`` gets the assistant message
        the projection left, when the batch has one (a turn's view)."""

        async def publish(tx: Tx) -> list[StoredEvent]:
            stored = await self.events.publish_many(events, tx=tx, fresh_ids=fresh_ids)
            if captured is not None and stored:
                mid = getattr(stored[0].data, "assistant_message_id", None)
                message = projector.cached_message(tx, mid) if mid else None
                if isinstance(message, AssistantMessage):
                    captured.append(message)
            return stored

        return await self.claims.run_fenced(claim, publish, step_attempt=step_attempt)

    async def close(self) -> None:
        await self.notifier.close()
        if self.writer is not None:
            await self.writer.close()
        await self.db.dispose()


async def open_store(
    url: str | None = None,
    *,
    settings: Settings | None = None,
    schema: str | None = None,
    migrate: bool = True,
) -> Store:
    """Open (and migrate to head) the store at ``url``, or at ``settings.database_url``."""
    settings = settings or Settings()
    pools = Pools(size=settings.db_pool_size, overflow=settings.db_pool_overflow)
    db = Database(
        url or settings.database_url, schema=schema, lease_ms=settings.lease_ms, pools=pools
    )
    try:
        if migrate:
            await db.migrate()
    except BaseException:
        await db.dispose()
        raise
    postgres = db.dialect == "postgresql"
    notifier = Notifier(db.psycopg_conninfo if postgres else None)
    poll_ms = settings.poll_interval_ms or (1000 if postgres else 100)
    events = EventStore(
        db, notifier, max_event_bytes=settings.max_event_bytes, poll_interval=poll_ms / 1000
    )
    projector.install(events)
    writer = PostgresWriter(db) if postgres else SqliteWriter(db)
    fetch = writer.fetch_prepared if isinstance(writer, PostgresWriter) else None
    return Store(
        db=db,
        notifier=notifier,
        events=events,
        claims=Claims(db, lease_ms=settings.lease_ms),
        inputs=Inputs(db, events),
        sessions=Sessions(db, events, fetch=fetch),
        hosts=Hosts(db, lease_ms=settings.host_lease),
        writer=writer,
    )
