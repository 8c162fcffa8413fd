"""``open_store``: one object with the database, event store, claims, inputs and sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from sessionflow.errors import StoreUnavailableError
from sessionflow.ids import new_ids, validate_id
from sessionflow.models import events as ev
from sessionflow.models.events import Event
from sessionflow.models.messages import AssistantMessage
from sessionflow.settings import Settings
from store import codec, projector
from store.claims import Claim, Claims, Phase, fence_params, run_params
from store.db import Database, Pools, Stamp, Tx
from store.events import EventStore, StoredEvent
from store.fast import PostgresWriter, SqliteWriter
from store.inputs import Inputs, Waiting, waiting
from store.notify import Notifier
from store.projector import apply_tool
from store.sessions import Sessions, StepBasis, StoredPart, TurnSnapshot
from store.tool_runs import ToolAttempt, ToolRuns

_tracer = trace.get_tracer("sessionflow.store")
# The events that move one tool part along and change nothing else.
ToolEvent = ev.ToolSucceeded | ev.ToolFailed | ev.ToolProgress


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


@dataclass(frozen=True)
class StepSnapshot:
    """A step's assistant message (None when there is none) as read outside any transaction,
    with the version of its session's claim row then: ``Store.end_step`` writes only if no
    fenced write came after the read."""

    message: Any
    version: str


@dataclass
class Store:
    db: Database
    notifier: Notifier
    events: EventStore
    claims: Claims
    inputs: Inputs
    sessions: Sessions
    writer: SqliteWriter | PostgresWriter | None = field(default=None)
    tool_runs: ToolRuns = field(default_factory=ToolRuns)

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
        ``store.fast``, and so, on PostgreSQL with a turn's ``view``, do batches that change only
        that message's parts; anything else is ``claims.fenced`` + ``events.publish_many``. All
        refuse with ``ClaimLostError`` (or ``StaleAttemptError``) and write nothing.
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
        """Projector-free events of one aggregate (deltas): ``store.fast``'s one transaction."""
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
            **_batch_params(claim, rows, parts, step_attempt),
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

    async def settle_call(
        self, claim: Claim, run: ToolAttempt, event: ToolEvent, before: StoredPart
    ) -> StoredEvent | None:
        """Append ``event``, which moves the tool part ``before`` along, in one statement on
        PostgreSQL: the fence (with ``run``'s attempt), the part's new state and the event.

        None when this path does not apply and nothing was written: on SQLite, or when the
        fence refused it or the part is no longer ``before``. The caller then takes the
        general path (``claims.fenced`` + ``events.publish``), which says why.
        """
        if not isinstance(self.writer, PostgresWriter):
            return None
        (row,) = self.events.prepare_rows([event], Stamp(claim.execution_id, claim.epoch))
        part = before.part.model_copy(deep=True)
        if not apply_tool(part, event, row["created"]):
            return None
        params = {
            **fence_params(claim),
            **run_params(run),
            "position": before.position,
            "before": before.data,
            "part": codec.dump_model(part),
            "id": row["id"],
            "created": row["created"],
            "type": row["type"],
            "data": row["data"],
        }
        stored: list[StoredEvent] = []

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            stored.extend(self.events.committed([row], [event]))

        if not await self.writer.settle_part(params, row, announce):
            return None
        return stored[0]

    async def open_turn(
        self,
        claim: Claim,
        snapshot: TurnSnapshot,
        *,
        step_attempt: int,
        phase: tuple[Phase, str | None],
    ) -> int | None:
        """A turn's opening that writes nothing but its fence (with ``step_attempt``, recording
        ``phase``) and the request's count, in one statement (``_PG_OPEN_TURN``), decided from
        ``snapshot``: the request's 0-based index. None when nothing was written: the fence
        refused it, or a fenced write came after the snapshot."""
        assert isinstance(self.writer, PostgresWriter)
        params = {
            **fence_params(claim),
            "attempt": step_attempt,
            "phase": phase[0],
            "mid": phase[1],
            "version": snapshot.version,
        }
        count = await self.writer.open_turn(params)
        return None if count is None else count - 1

    async def step_snapshot(self, session_id: str, message_id: str) -> StepSnapshot | None:
        """On PostgreSQL, the step's message read in one statement with its claim row's version
        (``_PG_STEP_READ``), for ``end_step``. None on SQLite, where the general path runs
        inline, or when the session has no claim."""
        if not isinstance(self.writer, PostgresWriter):
            return None
        rows = await self.writer.read_step(session_id, message_id)
        if not rows or rows[0][0] != -2:
            return None
        return StepSnapshot(projector.assemble(rows[1:]), str(rows[0][1]))

    async def end_step(
        self,
        claim: Claim,
        snapshot: StepSnapshot,
        events: Sequence[Event],
        *,
        step_attempt: int,
        phase: Phase,
    ) -> Waiting | None:
        """End a step in one statement (``_PG_END_STEP``): ``events`` (``STEP_END_EVENTS`` of
        the snapshot's message, which they change in memory), projected on the message as the
        snapshot read it, under the fence with ``step_attempt``, the phase recorded with it.
        Returns what waits to be promoted (as ``Inputs.waiting``), read in the same statement.

        None when nothing was written: the events are not all the message's step end, the
        fence refused it, or a fenced write came after the snapshot. The caller then takes the
        general path, which reads the message again in its transaction and says why.
        """
        message = snapshot.message
        assert isinstance(self.writer, PostgresWriter) and isinstance(message, AssistantMessage)
        kinds = projector.STEP_END_EVENTS
        if not all(self.events.projects_only(type(e), kinds) for e in events) or not (
            events and projector.ends_step_only(message, events)
        ):
            return None
        rows = self.events.prepare_rows(events, Stamp(claim.execution_id, claim.epoch))
        placed = [  # their projections read no seq: it is allocated by the statement
            StoredEvent(row["id"], row["aggregate_id"], -1, row["created"], row["type"], event)
            for row, event in zip(rows, events, strict=True)
        ]
        projected = await projector.project_in_memory(message, placed)
        params = _end_step_params(claim, snapshot, rows, projected, step_attempt, phase)

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            self.events.committed(rows, events)

        ended = await self.writer.end_step(params, rows, announce)
        return None if ended is None else waiting(*ended[1:])

    async def claim_at_once(
        self,
        session_id: str,
        execution_id: str,
        owner_id: str,
        started: Sequence[tuple[Event, str]],
    ) -> Claim | None:
        """On PostgreSQL, a session's first claim since its last release, with the events it
        starts (each with its id), in one statement (``_PG_CLAIM``) instead of a transaction of
        nine. None when nothing was written: on SQLite, or when the session has a claim row (a
        live claim, an expired one to take over, this execution's own) or the events exist;
        the caller then takes the general path (``Claims.acquire_with``), which says why."""
        if not isinstance(self.writer, PostgresWriter):
            return None
        validate_id(session_id)
        validate_id(execution_id, "execution")
        events = [event for event, _id in started]
        if not all(self.events.projects_only(type(event), ()) for event in events):
            return None
        rows = self._rows_with_ids(started, Stamp(execution_id, 0))  # the epoch: the statement's
        lease = self.claims.lease_ms
        params = {
            "sid": session_id,
            "eid": execution_id,
            "owner": owner_id,
            "lease": lease,
            **_event_params(session_id, rows),
        }

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            self.events.committed(rows, events)

        granted = await self.writer.claim(params, rows, announce)
        if granted is None:
            return None
        epoch, expires_at = granted
        return Claim(session_id, execution_id, owner_id, epoch, expires_at, lease)

    async def end_execution(
        self, claim: Claim, event: Event, terminal_id: str, *, release: bool
    ) -> bool:
        """A busy period's terminal ``event`` (stored as ``terminal_id``), its recoveries
        forgotten and, with ``release``, its claim released: on PostgreSQL, two statements
        (``_PG_EXECUTION_READ``, then ``_PG_END_EXECUTION`` fenced on the claim row's version
        as read) instead of a fenced transaction of nine round trips.

        False when nothing was written: on SQLite, when a retry is pending (the terminal's
        projection ends it), when the terminal is already there, when the fence refused it or
        a fenced write came after the read. The caller then takes the general path, which
        reads again in its transaction and says why.
        """
        if not isinstance(self.writer, PostgresWriter):
            return False
        if not self.events.projects_only(type(event), projector.EXECUTION_END_EVENTS):
            return False
        read = await self.writer.read_execution(claim.session_id, terminal_id)
        if not read:
            return False
        version, latest, written = read[0]
        if written or (latest is not None and projector.retry_pending(latest)):
            return False
        rows = self._rows_with_ids([(event, terminal_id)], Stamp(claim.execution_id, claim.epoch))
        params = {**fence_params(claim), **_event_params(claim.session_id, rows)}
        params["version"] = version

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            self.events.committed(rows, [event])

        return await self.writer.end_execution(params, rows, announce, release=release)

    def _rows_with_ids(
        self, events: Sequence[tuple[Event, str]], stamp: Stamp
    ) -> list[dict[str, Any]]:
        """Rows for ``events`` (``EventStore.prepare_rows``) under the ids they come with."""
        rows = self.events.prepare_rows([event for event, _id in events], stamp)
        for row, (_event, id) in zip(rows, events, strict=True):
            row["id"] = id
        return rows

    async def close(self) -> None:
        await self.notifier.close()
        if self.writer is not None:
            await self.writer.close()
        await self.db.dispose()


def _batch_params(
    claim: Claim,
    rows: list[dict[str, Any]],
    parts: list[dict[str, Any]],
    step_attempt: int | None,
) -> dict[str, Any]:
    """A batch's parameters as ``_PG_START`` and ``_PG_END_STEP`` take them: the fence, its
    events, the parts it changed."""
    return {
        **fence_params(claim),
        "attempt": -1 if step_attempt is None else step_attempt,
        **_event_params(claim.session_id, rows),
        "positions": [part["position"] for part in parts],
        "call_ids": [part["call_id"] for part in parts],
        "parts": [part["body"] for part in parts],
    }


def _event_params(session_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The session's events as the hot path's statements insert them (``_PG_INSERTED``)."""
    return {
        "agg": session_id,
        "n": len(rows),
        "ids": [row["id"] for row in rows],
        "createds": [row["created"] for row in rows],
        "types": [row["type"] for row in rows],
        "datas": [row["data"] for row in rows],
    }


def _end_step_params(
    claim: Claim,
    snapshot: StepSnapshot,
    rows: list[dict[str, Any]],
    projected: projector.Projected,
    step_attempt: int,
    phase: Phase,
) -> dict[str, Any]:
    usage = projected.usage or dict.fromkeys(
        ("at", "cost", "input", "output", "reasoning", "cache_read", "cache_write")
    )
    return {
        **_batch_params(claim, rows, projected.parts, step_attempt),
        **usage,
        "phase": phase,
        "version": snapshot.version,
        "mid": snapshot.message.id,
        "body": projected.row,
        "updated": projected.updated,
        "usage": projected.usage is not None,
    }


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
        writer=writer,
    )
