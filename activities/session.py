"""The drain's activities: claim glue, preparation, input checks, step settlement, lifecycle.

Every write goes through a fenced transaction under the drain's claim (``run_fenced``, run again
after a serialization failure or a deadlock: catalogue C6); every activity is idempotent,
because Temporal delivers activities at least once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypedDict

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from activities.children import closing_of_task, parent_call, report
from activities.restart import (
    BUDGET_MESSAGE,
    LOST_STEP,
    RESTART_TEXT,
    closing_events,
    restart_message,
    stale,
)
from activities.runtime import (
    Runtime,
    application_error,
    is_running_run,
    own,
    to_claim,
    to_ref,
    translated,
)
from activities.tools.changes import step_files
from sessionflow.agents import UnknownAgentError
from sessionflow.errors import ClaimHeldError
from sessionflow.models import events as ev
from sessionflow.models.common import SessionError, Tokens
from sessionflow.models.drain import (
    LOCAL_HOST,
    RESUME_BUDGET,
    AcquireInput,
    ClaimAndPrepareInput,
    ClaimAndPrepareResult,
    ClaimRef,
    FinishExecutionInput,
    FinishStepInput,
    FinishStepResult,
    Outcome,
    PendingInput,
    PendingResult,
    PrepareInput,
    PrepareResult,
    Promotion,
    ReportInput,
    StoredOutcome,
    StoredOutcomeInput,
)
from sessionflow.models.messages import (
    AssistantMessage,
    Message,
    SyntheticMessage,
    ToolError,
    ToolPart,
    ToolRunning,
)
from sessionflow.models.permissions import PermissionReply
from store.claims import Phase, Recovery
from store.db import Tx
from store.inputs import Waiting
from store.projector import load_message
from store.write.decide import Decision, Written

__all__ = ["BUDGET_MESSAGE", "RESTART_TEXT", "SessionActivities"]

BUDGET_ERROR = SessionError(type="aborted", message=BUDGET_MESSAGE)
INTERRUPTED_TOOL = SessionError(type="aborted", message="Tool execution interrupted")
INTERRUPTED_STEP = SessionError(type="aborted", message="Step interrupted")
RESULT_MISSING = SessionError(
    type="tool.result-missing", message="Provider did not return a tool result"
)


async def closed_owner(held: ClaimHeldError) -> str | None:
    """The execution holding the claim if Temporal says its run is over, else None (its lease
    decides). The holder is a run of this session's workflow (``<run id>_<period>``), and a
    workflow runs one run at a time: when this activity's run is the running one, every other
    run is closed (terminated, reset, timed out, failed), and so is any run it continued as
    new into (a run carrying a claim on never acquires one)."""
    if not activity.in_activity():
        return None  # called directly (the store's own tests): the lease decides
    run_id, sep, _period = held.execution_id.rpartition("_")
    info = activity.info()
    workflow = info.workflow_id
    if not sep or not run_id or workflow is None or run_id == info.workflow_run_id:
        return None
    try:
        client = activity.client()
    except RuntimeError:
        return None  # an activity environment without a client (tests)
    try:
        holder = await client.get_workflow_handle(workflow, run_id=run_id).describe()
        current = await client.get_workflow_handle(workflow).describe()
    except RPCError:
        return None  # unknown to Temporal (another deployment's run, a server blip)
    if holder.status in (None, WorkflowExecutionStatus.RUNNING):
        return None
    return held.execution_id if is_running_run(current, info.workflow_run_id) else None


class WorkerLimits(TypedDict):
    turn_timeout_s: int
    retry_backoff_ms: int
    host_lease_ms: int


class SessionActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    @property
    def store(self) -> Any:
        return self.rt.store

    # --- claim and lifecycle --------------------------------------------------------------------

    @activity.defn
    async def acquire_claim(self, request: AcquireInput) -> ClaimRef:
        started = ev.ExecutionStarted(
            session_id=request.session_id, execution_id=request.execution_id
        )

        begin = [(started, f"evt_{request.execution_id}_started")]
        ids = (request.session_id, request.execution_id, request.owner_id)
        async with translated():
            try:
                claim = await self.store.acquire(*ids, begin)
            except ClaimHeldError as held:
                dead = await closed_owner(held)
                if dead is None:
                    raise application_error(held, claim_wait_s=self.rt.claim_wait_s) from held
                # Temporal says the owner's run is over (terminated, reset, timed out): no need
                # to wait for its lease. Its zombie activities are fenced by the new epoch.
                claim = await self.store.acquire(*ids, begin, dead=dead)
            return to_ref(claim)

    @activity.defn
    async def finish_execution(self, request: FinishExecutionInput) -> None:
        """The busy period's one terminal event, and the claim released with it."""
        claim, outcome = request.claim, request.outcome
        event: ev.Event
        if outcome.type == "succeeded":
            event = ev.ExecutionSucceeded(
                session_id=claim.session_id, execution_id=claim.execution_id
            )
        elif outcome.type == "interrupted":
            event = ev.ExecutionInterrupted(
                session_id=claim.session_id,
                execution_id=claim.execution_id,
                reason=outcome.reason or "user",
            )
        else:
            error = outcome.error or SessionError(type="unknown", message="Drain failed")
            event = ev.ExecutionFailed(
                session_id=claim.session_id, execution_id=claim.execution_id, error=error
            )
        terminal_id = f"evt_{claim.execution_id}_{outcome.type}"
        async with translated():
            await self.store.finish_execution(
                await own(self.store, claim), event, terminal_id, release=not request.keep_claim
            )
            if request.parent is not None:
                why = outcome.error.message[:1000] if outcome.error else outcome.reason
                told = ReportInput(
                    parent=request.parent,
                    child_session_id=claim.session_id,
                    outcome=outcome.type,
                    error=why,
                )
                await report(self.store, told)

    @activity.defn
    async def stored_outcome(self, request: StoredOutcomeInput) -> StoredOutcome:
        """The busy period's outcome as its terminal event says (None: no terminal of that
        execution in the log). For a workflow task retried after its first attempt had
        already written the terminal and released the claim: joiners are told what the log
        says, not the refusal the retry met."""
        sid = request.session_id
        async with translated():
            for kind in (ev.ExecutionSucceeded, ev.ExecutionFailed, ev.ExecutionInterrupted):
                stored = await self.store.events.latest_of(sid, kind)
                data = stored.data if stored is not None else None
                if data is None or getattr(data, "execution_id", None) != request.execution_id:
                    continue
                execution = request.execution_id
                if isinstance(data, ev.ExecutionFailed):
                    outcome = Outcome(type="failed", error=data.error, execution_id=execution)
                elif isinstance(data, ev.ExecutionInterrupted):
                    reason = data.reason
                    outcome = Outcome(type="interrupted", reason=reason, execution_id=execution)
                else:
                    outcome = Outcome(type="succeeded", execution_id=execution)
                return StoredOutcome(outcome=outcome)
        return StoredOutcome()

    @activity.defn
    async def claim_and_prepare(self, request: ClaimAndPrepareInput) -> ClaimAndPrepareResult:
        """``acquire_claim`` then ``prepare_drain``: a busy period's start as one local
        activity (one workflow activation fewer). Both halves are idempotent, so a failure in
        the second is retried as the two separate activities."""
        claim = await self.acquire_claim(request.acquire)
        prep = await self.prepare_drain(PrepareInput(claim=claim, force=request.force))
        return ClaimAndPrepareResult(claim=claim, prep=prep)

    # --- preparation ----------------------------------------------------------------------------

    @activity.defn
    async def prepare_drain(self, request: PrepareInput) -> PrepareResult:
        """Recover a dead execution's turn, fail stale tools, and decide whether to run."""
        claim = await own(self.store, request.claim)
        sid = claim.session_id
        async with translated():
            session = await self.store.sessions.get(sid)
            try:
                agent = self.rt.agents.get(session.agent)
            except UnknownAgentError as error:
                failure = SessionError(type="unknown", message=str(error))
                return PrepareResult(run=False, failure=failure, **self._worker_limits())
            limits = {
                "max_steps": session.settings.get("max_steps") or agent.max_steps,
                "max_active_tools": session.settings.get("max_active_tools", 8),
                "parent": parent_call(session),
                **self._worker_limits(),
            }
            force = request.force
            for recovery in await self.store.claims.recoveries(sid):
                if not await self.store.claims.run_fenced(claim, self._recoverer(recovery)):
                    return PrepareResult(run=False, failure=BUDGET_ERROR, **limits)
            messages = await self.store.sessions.messages(sid)  # read once for both checks
            owed = await self._budget_stopped_midway(sid, messages)
            force = force or owed or _restart_unanswered(messages)
            steer, queue, compaction = await self.store.inputs.waiting(sid)
            if not (force or steer or queue or compaction):
                return PrepareResult(run=False, **limits)
            stale = await self._fail_stale_tools(claim, messages)
            promotion: Promotion = "steer" if steer else "queue" if queue else None
            if owed and promotion == "queue":
                promotion = None  # the stopped step's continuation first, then the queue
            live = True  # the local host's tools run on the shared queue, whose worker this is
            if session.host != LOCAL_HOST:
                live = (await self.store.hosts.state(session.host)).live
            return PrepareResult(
                run=True,
                promotion=promotion,
                stale_tools=stale,
                compaction=compaction,
                host=session.host,
                host_live=live,
                **limits,
            )

    async def _budget_stopped_midway(self, sid: str, messages: list[Message]) -> bool:
        """Did the last busy period end at its budget with a step that owes the model its
        tools' results? Then the next one continues that step before anything queued (the
        terminals are read only when the history ends with such a step)."""
        last = messages[-1] if messages else None
        if not isinstance(last, AssistantMessage) or last.finish != "tool-calls":
            return False
        if not all(p.settled for p in last.content if isinstance(p, ToolPart)):
            return False
        stopped = await self.store.events.latest_of(sid, ev.ExecutionInterrupted)
        if stopped is None or getattr(stopped.data, "reason", None) != "budget":
            return False
        for kind in (ev.ExecutionSucceeded, ev.ExecutionFailed):
            ended = await self.store.events.latest_of(sid, kind)
            if ended is not None and ended.seq > stopped.seq:
                return False
        return True

    def _worker_limits(self) -> WorkerLimits:
        """The worker's settings the workflow applies (it holds no settings of its own)."""
        return WorkerLimits(
            turn_timeout_s=self.rt.turn_timeout_s,
            retry_backoff_ms=self.rt.retry_backoff_ms,
            host_lease_ms=self.store.hosts.lease_ms,
        )

    def _recoverer(self, recovery: Recovery) -> Callable[[Tx], Awaitable[bool]]:
        """Close the dead execution's turn: False when its resume budget is spent. Work for
        ``run_fenced`` (C6): each run decides afresh from what its transaction reads."""

        async def recover(tx: Tx) -> bool:
            attempts = await self.store.claims.begin_recovery(tx, recovery)
            closing = await self._close_dead(tx, recovery)
            if attempts > RESUME_BUDGET:
                await self.store.events.publish_many(closing, tx=tx)
                await self.store.claims.fail_recovery(tx, recovery, BUDGET_MESSAGE)
                return False
            closing.append(restart_message(recovery.session_id))
            await self.store.events.publish_many(closing, tx=tx)
            return True

        return recover

    async def _close_dead(
        self, tx: Tx, recovery: Recovery
    ) -> list[ev.Event | tuple[ev.Event, str]]:
        """The dead execution's step, if it never ended, closed as a lost turn's is; then the
        dead execution's one terminal event (it died before writing it: a terminal releases
        the claim, and only an unreleased claim is taken over)."""
        events: list[ev.Event | tuple[ev.Event, str]] = []
        message_id = recovery.continuation_message_id
        message = await load_message(tx, recovery.session_id, message_id) if message_id else None
        if isinstance(message, AssistantMessage) and message.time_completed is None:
            events += await closing_events(self.store, message, LOST_STEP, tx)
        terminal = ev.ExecutionInterrupted(
            session_id=recovery.session_id, execution_id=recovery.execution_id, reason="superseded"
        )
        events.append((terminal, f"evt_{recovery.execution_id}_interrupted"))
        return events

    async def _fail_stale_tools(self, claim: Any, messages: list[Message]) -> int:
        """Tools left pending or running by a dead process become ``tool.stale`` errors (a
        ``task`` call closes as its child says, ``closing_of_task``)."""
        open_calls = [
            (message, part)
            for message in messages
            if isinstance(message, AssistantMessage)
            for part in message.content
            if isinstance(part, ToolPart) and not part.settled
        ]
        if not open_calls:
            return 0

        async def fail(tx: Tx) -> None:
            failed = [
                await closing_of_task(self.store, message, part, tx) or stale(message, part)
                for message, part in open_calls
            ]
            await self.store.events.publish_many(failed, tx=tx)

        await self.store.claims.run_fenced(claim, fail)
        return len(open_calls)

    @activity.defn
    async def pending_inputs(self, request: PendingInput) -> PendingResult:
        sid = request.claim.session_id
        async with translated():
            steer, queue, compaction = await self.store.inputs.waiting(sid)
        return PendingResult(steer=steer, queue=queue, compaction=compaction)

    # --- step settlement ------------------------------------------------------------------------

    @activity.defn
    async def finish_step(self, request: FinishStepInput) -> FinishStepResult:
        """Settle a step after all its tools: at most one terminal step event (ref. §4.5.14)."""
        return await self.settle_step(request)

    async def settle_step(self, request: FinishStepInput) -> FinishStepResult:
        """``finish_step``'s work, also done by a turn that made no local calls."""
        turn, claim = request.turn, await own(self.store, request.claim)
        async with translated():
            if turn.lost is not None:
                return await self._close_lost(request)
            written: Written[FinishStepResult] = await self.store.end_step_with(
                claim,
                turn.assistant_message_id,
                lambda message: self._settlement(request, message),
                step_attempt=request.attempt,
            )
            if written.waiting is None:
                return written.result
            return _with_pending(written.result, written.waiting)

    async def _close_lost(self, request: FinishStepInput) -> FinishStepResult:
        """End the lost step; unless the resume budget is spent, ask the model to continue.
        A step its turn had settled before the loss is not restarted (``ended``, no
        ``restarted``): the workflow takes it as settled."""
        turn, claim = request.turn, await own(self.store, request.claim)
        assert turn.lost is not None
        lost = turn.lost

        async def close(tx: Tx) -> FinishStepResult:
            # Read in the transaction, afresh on each run (C6: again after a conflict).
            message = await load_message(tx, claim.session_id, turn.assistant_message_id)
            if not isinstance(message, AssistantMessage):
                if not request.restart:
                    return FinishStepResult(ended=False, failure=BUDGET_ERROR)
                return FinishStepResult(ended=False, failure=turn.step_failure or turn.raw_error)
            return await self._close_lost_in(tx, request, message, lost)

        result: FinishStepResult = await self.store.claims.run_fenced(
            claim, close, step_attempt=request.attempt
        )
        return result

    async def _close_lost_in(
        self, tx: Tx, request: FinishStepInput, message: AssistantMessage, lost: SessionError
    ) -> FinishStepResult:
        restarted = FinishStepResult(ended=False, needs_continuation=True, restarted=True)
        spent = FinishStepResult(ended=False, failure=BUDGET_ERROR)
        if _ended(message):
            if message.error != lost:
                # Not ended by this close, whose end carries the loss as its error: the turn
                # settled its step itself and only its answer was lost. Restarting the step
                # would ask the model again after its final answer.
                return _as_settled(message, request.turn)
            return restarted if request.restart else spent  # an earlier attempt closed it
        events = await closing_events(self.store, message, lost, tx)
        if request.restart:
            events.append(restart_message(message.session_id))
        await self.store.events.publish_many(events, tx=tx)
        phase: Phase = "continue" if request.restart else "ready"
        await self.store.claims.record_phase(tx, to_claim(request.claim), phase, message.id)
        return restarted if request.restart else spent

    def _settlement(self, request: FinishStepInput, message: Any) -> Decision[FinishStepResult]:
        """How the step ends, decided from its message alone (no I/O), so that the store may
        write it at once or in a fenced transaction."""
        turn = request.turn
        if not isinstance(message, AssistantMessage):
            return Decision(
                FinishStepResult(ended=False, failure=turn.step_failure or turn.raw_error)
            )
        if _ended(message):
            # Already settled by an earlier attempt of this activity: settle once.
            return Decision(_as_settled(message, turn))
        if request.retry_at_ms is not None and turn.raw_error is not None:
            return _retry(request, message)
        unsettled = [p for p in message.content if isinstance(p, ToolPart) and not p.settled]
        events: list[ev.Event | tuple[ev.Event, str]] = []
        failure = turn.step_failure
        rejected = _permission_rejected(message)
        if request.interrupted:
            events += _settle_asks(message, unsettled, request.replies)
            events += [_tool_failed(message, p, INTERRUPTED_TOOL) for p in unsettled]
            failure = INTERRUPTED_STEP
        elif rejected is not None:
            # A tool refused on permission grounds: the step fails, no continuation (#64).
            events += [_tool_failed(message, p, INTERRUPTED_TOOL) for p in unsettled]
            failure = rejected
        elif request.infrastructure_error is not None:
            failure = request.infrastructure_error
            events += [_tool_failed(message, p, failure) for p in unsettled]
        else:
            failure = self._sweep(message, unsettled, turn, events, failure)
        events += _step_end(message, turn, failure)
        needs = bool(turn.calls) and not turn.provider_failed and failure is None
        return Decision(
            FinishStepResult(ended=failure is None, failure=failure, needs_continuation=needs),
            events,
            phase="continue" if needs else "ready",
            phase_of=message.id,
            # The workflow's next question, answered here instead of by another activity.
            wants_waiting=not needs and not request.interrupted,
        )

    @staticmethod
    def _sweep(
        message: AssistantMessage,
        unsettled: list[ToolPart],
        turn: Any,
        events: list[ev.Event | tuple[ev.Event, str]],
        failure: SessionError | None,
    ) -> SessionError | None:
        local = [p for p in unsettled if not p.executed and p.state.status == "running"]
        hosted = [p for p in unsettled if p.executed]
        # Every started tool has settled by now, so a called local tool still running here
        # never ran (its turn died before the workflow heard of it): it is aborted.
        events += [_tool_failed(message, p, INTERRUPTED_TOOL) for p in local]
        if turn.provider_failed:
            # Reference §4.5 step 14j: every unsettled call, hosted ones included, is aborted.
            events += [_tool_failed(message, p, INTERRUPTED_TOOL) for p in hosted]
            return failure
        events += [_tool_failed(message, p, RESULT_MISSING) for p in hosted]
        if turn.raw_error is not None:
            return failure or turn.raw_error
        if hosted and turn.finish is None:
            return failure or RESULT_MISSING
        return failure


def _ended(message: AssistantMessage) -> bool:
    return message.time_completed is not None and message.finish is not None


def _as_settled(message: AssistantMessage, turn: Any) -> FinishStepResult:
    """The answer of the settlement that ended ``message``'s step, given again to an attempt
    that finds it ended. A lost turn lists no calls, and rightly: a turn settles its own step
    only when it made none, so nothing continues it."""
    return FinishStepResult(
        ended=message.error is None,
        failure=message.error,
        needs_continuation=bool(turn.calls) and message.error is None,
    )


def _retry(request: FinishStepInput, message: AssistantMessage) -> Decision[FinishStepResult]:
    """A retry of the provider request, scheduled for ``retry_at_ms``."""
    turn = request.turn
    assert request.retry_at_ms is not None and turn.raw_error is not None
    attempt = request.retry_attempt or 2
    retry = ev.RetryScheduled(
        session_id=message.session_id,
        assistant_message_id=message.id,
        attempt=attempt,
        at=request.retry_at_ms,
        error=turn.raw_error,
    )
    return Decision(
        FinishStepResult(ended=False),
        # A fixed id: a retried activity records the retry once.
        [(retry, f"evt_{message.id}_retry_{attempt}")],
        phase="continue",
        phase_of=message.id,
        # Nothing renews the claim while the workflow waits: hold it past the retry.
        hold_until=request.retry_at_ms + request.claim.lease_ms,
    )


def _step_end(
    message: AssistantMessage, turn: Any, failure: SessionError | None
) -> list[ev.Event | tuple[ev.Event, str]]:
    """The step's terminal event: failed, ended, or none when the provider never finished."""
    if failure is not None:
        failed = ev.StepFailed(
            session_id=message.session_id,
            assistant_message_id=message.id,
            error=failure,
            cost=turn.cost if turn.finish else None,
            tokens=turn.tokens if turn.finish else None,
        )
        return [failed]
    if turn.finish is None:
        return []
    ended = ev.StepEnded(
        session_id=message.session_id,
        assistant_message_id=message.id,
        finish=turn.finish,
        cost=turn.cost,
        tokens=turn.tokens or Tokens(),
        files=step_files(p for p in message.content if isinstance(p, ToolPart)),
    )
    return [ended]


def _with_pending(result: FinishStepResult, waiting: Waiting) -> FinishStepResult:
    steer, queue, compaction = waiting
    pending = PendingResult(steer=steer, queue=queue, compaction=compaction)
    return result.model_copy(update={"pending": pending})


def _permission_rejected(message: AssistantMessage) -> SessionError | None:
    for part in message.content:
        state = part.state if isinstance(part, ToolPart) else None
        if isinstance(state, ToolError) and state.error.type == "permission.rejected":
            return state.error
    return None


def _settle_asks(
    message: AssistantMessage, unsettled: list[ToolPart], replies: tuple[PermissionReply, ...]
) -> list[ev.Event | tuple[ev.Event, str]]:
    """The asks the interrupted step leaves unanswered: each gets its reply, the person's when a
    rejection stopped the step, else "interrupted"."""
    given = {reply.request_id: reply for reply in replies}
    events: list[ev.Event | tuple[ev.Event, str]] = []
    for part in unsettled:
        asked = part.state.asked if isinstance(part.state, ToolRunning) else None
        if asked is None:
            continue
        reply = given.get(asked.request_id)
        replied = (
            ev.PermissionReplied(
                session_id=message.session_id,
                request_id=asked.request_id,
                assistant_message_id=message.id,
                call_id=part.call_id,
                decision="reject",
                message=reply.message if reply else None,
                by=reply.by if reply else None,
                reason="answered" if reply else "interrupted",
            ),
            f"evt_{asked.request_id}_replied",
        )
        events.append(replied)
    return events


def _restart_unanswered(messages: list[Message]) -> bool:
    """Derived from the history, not from an attempt's memory: a retried preparation still
    continues a recovered turn whose restart message is not yet answered."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return False
        if isinstance(message, SyntheticMessage) and message.text == RESTART_TEXT:
            return True
    return False


def _tool_failed(message: AssistantMessage, part: ToolPart, error: SessionError) -> ev.ToolFailed:
    return ev.ToolFailed(
        session_id=message.session_id,
        assistant_message_id=message.id,
        call_id=part.call_id,
        error=error,
        executed=part.executed,
    )
