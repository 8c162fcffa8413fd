"""The store's writes that depend on what they read, as the activities call them.

Each public method here is one store call for one step of a drain (a claim, a turn's opening, a
step's end, a tool's settlement, a busy period's end): the caller hands over what it decided, or
the pure function that decides, and the store picks the form. On PostgreSQL the usual case is
written at once, by one statement composed from the fence (``fence.py``) and seq allocation
(``allocation.py``) that applies only if nothing moved since the read; everything else, and
every write on SQLite, is a fenced transaction (``Claims.run_fenced``) that reads again and
decides again (``decide.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sessionflow.errors import ClaimLostError
from sessionflow.ids import validate_id
from sessionflow.models import events as ev
from sessionflow.models.events import Event
from sessionflow.models.messages import AssistantMessage, ToolPart
from store import codec, projector
from store.claims import Claim, Claims, Phase, fence_params, run_params
from store.db import Stamp, Tx
from store.events import EventStore, StoredEvent
from store.inputs import Inputs, Waiting, waiting
from store.projector import apply_tool
from store.sessions import Sessions, StoredPart, TurnSnapshot
from store.tool_runs import ToolAttempt
from store.write.decide import Decision, Written, decide_then_write
from store.write.fast import PostgresWriter, SqliteWriter

R = TypeVar("R")
B = TypeVar("B")
# The events that move one tool part along and change nothing else.
ToolEvent = ev.ToolSucceeded | ev.ToolFailed | ev.ToolProgress


@dataclass(frozen=True)
class StepSnapshot:
    """A step's assistant message (None when there is none) as read outside any transaction,
    with the version of its session's claim row then: ``Store.end_step`` writes only if no
    fenced write came after the read."""

    message: Any
    version: str


class Writes:
    """The decided writes and their one-statement forms; ``Store`` holds the parts."""

    writer: SqliteWriter | PostgresWriter | None
    events: EventStore
    claims: Claims
    inputs: Inputs
    sessions: Sessions

    # --- decided writes: what activities call; the store picks the form ------------------------

    async def acquire(
        self,
        session_id: str,
        execution_id: str,
        owner_id: str,
        started: Sequence[tuple[Event, str]],
        *,
        dead: str | None = None,
    ) -> Claim:
        """Claim the session for ``execution_id`` with the events that start it (each with its
        id), committed together: in one statement when the session has no claim row
        (``claim_at_once``), else in a transaction retried whole (``Claims.acquire_with``).
        ``dead``: an execution whose live claim is taken over at once (``Claims.acquire``)."""
        if dead is None:
            claim = await self.claim_at_once(session_id, execution_id, owner_id, started)
            if claim is not None:
                return claim

        async def start(_claim: Claim, tx: Tx) -> None:
            await self.events.publish_many(started, tx=tx)

        return await self.claims.acquire_with(session_id, execution_id, owner_id, start, dead=dead)

    async def finish_execution(
        self, claim: Claim, event: Event, terminal_id: str, *, release: bool
    ) -> None:
        """A busy period's terminal ``event`` (as ``terminal_id``), its recoveries forgotten and,
        with ``release``, the claim released, all in one commit (``end_execution``, else a
        fenced transaction): never finished but still claimed, nor released without it."""
        if await self.end_execution(claim, event, terminal_id, release=release):
            return

        async def finish(tx: Tx) -> None:
            await self.events.publish(event, id=terminal_id, tx=tx)
            await self.claims.clear_recoveries(tx, claim.session_id)
            if release:
                await self.claims.release_in(tx, claim)

        try:
            await self.claims.run_fenced(claim, finish)
        except ClaimLostError:
            # An earlier attempt committed and lost its answer (catalogue C2): the claim is
            # released because this very terminal was written with it.
            if not await self.events.exists(claim.session_id, terminal_id):
                raise

    async def begin_turn(
        self,
        claim: Claim,
        message_id: str,
        *,
        prepare: Callable[[TurnSnapshot], Awaitable[Callable[[int], B] | None]],
        begin: Callable[[Tx], Awaitable[B]],
        step_attempt: int,
        phase: tuple[Phase, str | None],
    ) -> B:
        """Open a turn's attempt, recording ``phase`` under the fence with ``step_attempt``.

        On PostgreSQL the usual opening (``prepare`` returns how to answer from the request's
        index) is the session read with its claim row's version, then the fence with the
        request's count in one statement (``open_turn``) if no fenced write came between.
        Otherwise (``prepare`` says None, or the version moved) ``begin`` runs in a fenced
        transaction that records the phase."""
        snapshot = await self.sessions.turn_snapshot(claim.session_id, message_id)
        if snapshot is not None:
            answer = await prepare(snapshot)
            if answer is not None:
                index = await self.open_turn(
                    claim, snapshot, step_attempt=step_attempt, phase=phase
                )
                if index is not None:
                    return answer(index)
        return await self.claims.run_fenced(claim, begin, step_attempt=step_attempt, phase=phase)

    async def end_step_with(
        self,
        claim: Claim,
        message_id: str,
        decide: Callable[[Any], Decision[R]],
        *,
        step_attempt: int,
    ) -> Written[R]:
        """End a step as ``decide`` says from its message (None when there is none), under the
        fence with ``step_attempt``: at once (``end_step``) when the decision writes a phase,
        no hold and only fresh events, else decided again in a fenced transaction."""

        async def at_once(decide: Callable[[Any], Decision[R]]) -> Written[R] | None:
            snapshot = await self.step_snapshot(claim.session_id, message_id)
            if snapshot is None or not isinstance(snapshot.message, AssistantMessage):
                return None
            decision = decide(snapshot.message)
            fresh = [event for event in decision.events if not isinstance(event, tuple)]
            if decision.phase is None or decision.hold_until is not None or decision.lease_after:
                return None
            if len(fresh) < len(decision.events):
                return None  # events with fixed ids, to look up first
            waiting = await self.end_step(
                claim, snapshot, fresh, step_attempt=step_attempt, phase=decision.phase
            )
            if waiting is None:
                return None
            return Written(decision.result, waiting if decision.wants_waiting else None)

        async def read(tx: Tx) -> Any:
            return await projector.load_message(tx, claim.session_id, message_id)

        return await decide_then_write(
            decide,
            at_once=at_once,
            fenced=lambda work: self.claims.run_fenced(claim, work, step_attempt=step_attempt),
            read=read,
            write=lambda tx, decision: self._write_decision(tx, claim, decision),
        )

    async def settle_with(
        self,
        claim: Claim,
        run: ToolAttempt,
        before: StoredPart | None,
        decide: Callable[[ToolPart | None], Decision[R]],
    ) -> R:
        """Settle ``run``'s call as ``decide`` says from its part (None when there is none),
        under the fence with the call's attempt: at once from ``before`` (the part as read when
        the call began) when the decision is one event and the part is still ``before``
        (``settle_call``), else decided again in a fenced transaction that reads the part."""

        async def at_once(decide: Callable[[ToolPart | None], Decision[R]]) -> Written[R] | None:
            if before is None:
                return None
            decision = decide(before.part)
            if len(decision.events) != 1 or decision.phase is not None:
                return None
            (event,) = decision.events
            if not isinstance(event, ToolEvent) or decision.lease_after is not None:
                return None
            if await self.settle_call(claim, run, event, before) is None:
                return None
            return Written(decision.result)

        async def read(tx: Tx) -> ToolPart | None:
            message = await projector.load_message(tx, claim.session_id, run.assistant_message_id)
            return message.tool(run.call_id) if isinstance(message, AssistantMessage) else None

        written = await decide_then_write(
            decide,
            at_once=at_once,
            fenced=lambda work: self.claims.run_fenced(claim, work, run=run),
            read=read,
            write=lambda tx, decision: self._write_decision(tx, claim, decision),
        )
        return written.result

    async def _write_decision(
        self, tx: Tx, claim: Claim, decision: Decision[Any]
    ) -> Waiting | None:
        """``decision`` written in the fenced ``tx``."""
        await self.events.publish_many(decision.events, tx=tx)
        if decision.phase is not None:
            await self.claims.record_phase(tx, claim, decision.phase, decision.phase_of)
        if decision.hold_until is not None:
            await self.claims.extend_until(tx, claim, decision.hold_until)
        step = decision.lease_after
        if step is not None and not await projector.step_waits(tx, claim.session_id, step):
            await self.claims.lease_again(tx, claim)
        if not decision.wants_waiting:
            return None
        return await self.inputs.waiting(claim.session_id, tx=tx)

    # --- the one-statement forms ------------------------------------------------------------

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
        params = end_step_params(claim, snapshot, rows, projected, step_attempt, phase)

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
            **event_params(session_id, rows),
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
        params = {**fence_params(claim), **event_params(claim.session_id, rows)}
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


def batch_params(
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
        **event_params(claim.session_id, rows),
        "positions": [part["position"] for part in parts],
        "call_ids": [part["call_id"] for part in parts],
        "parts": [part["body"] for part in parts],
    }


def event_params(session_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The session's events as the hot path's statements insert them (``_PG_INSERTED``)."""
    return {
        "agg": session_id,
        "n": len(rows),
        "ids": [row["id"] for row in rows],
        "createds": [row["created"] for row in rows],
        "types": [row["type"] for row in rows],
        "datas": [row["data"] for row in rows],
    }


def end_step_params(
    claim: Claim,
    snapshot: StepSnapshot,
    rows: list[dict[str, Any]],
    projected: projector.Projected,
    step_attempt: int,
    phase: Phase,
) -> dict[str, Any]:
    usage = projected.usage or dict.fromkeys(("at", *projector.USAGE_SUMS))
    return {
        **batch_params(claim, rows, projected.parts, step_attempt),
        **usage,
        "phase": phase,
        "version": snapshot.version,
        "mid": snapshot.message.id,
        "body": projected.row,
        "updated": projected.updated,
        "usage": projected.usage is not None,
    }
