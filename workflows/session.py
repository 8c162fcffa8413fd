"""The session drain: one entity workflow per session (id ``session-<session id>``).

Busy periods follow the run coordinator of reference §3: a wake while idle starts a non-forced
drain, wakes during a drain coalesce into one follow-up, ``resume`` forces a drain or joins the
running one, an interrupt cancels the work, settles it durably and ends the busy period; wakes
that arrive while it settles start a successor. Each busy period claims the session, publishes
exactly one ``execution.started`` and one terminal event, and releases the claim.

Payloads are ids, counts and short errors: the activities read and write the store.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    RetryState,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

from workflows.approvals import Approvals
from workflows.children import Children
from workflows.hosts import HostCalls
from workflows.options import (
    CLAIM,
    CLAIM_AT_ONCE,
    CLAIM_WAIT,
    COMPACT,
    QUEUE_WAIT,
    REVERT,
    SHORT,
    TOOL,
    TURN,
    call,
)

with workflow.unsafe.imports_passed_through():
    from sessionflow.errors import CLAIM_RELEASED
    from sessionflow.models.common import SessionError
    from sessionflow.models.drain import (
        LOCAL_HOST,
        RESUME_BUDGET,
        AcquireInput,
        CallRef,
        CapacityWait,
        ChildFinished,
        ClaimAndPrepareInput,
        ClaimAndPrepareResult,
        ClaimRef,
        CompactInput,
        CompactResult,
        DrainInput,
        DrainResume,
        DrainStatus,
        FinishExecutionInput,
        FinishStepInput,
        FinishStepResult,
        InterruptRequest,
        InterruptResult,
        Outcome,
        ParentCall,
        PendingInput,
        PendingResult,
        PrepareInput,
        PrepareResult,
        Promotion,
        ResumeRequest,
        RevertInput,
        RevertRequest,
        RunningTool,
        StoredOutcome,
        StoredOutcomeInput,
        ToolInput,
        ToolOutcome,
        ToolsReady,
        TurnInput,
        TurnResult,
        tool_queue,
    )
    from sessionflow.models.events import Todo
    from sessionflow.models.journal import RevertPlan
    from sessionflow.models.permissions import PermissionReply, RespondResult
    from sessionflow.models.spend import BudgetReached

MAX_RETRIES = 4
# Failures that say nothing about the model: the turn's worker was killed, shut down, lost its
# database or its server connection. The turn is restarted, not failed (DESIGN "A dead turn is
# not a failed turn"). Anything else -- a bug, a bad setting -- fails the busy period as before.
TRANSIENT_TYPES = frozenset(
    {
        "WorkerShutdown",
        "OperationalError",
        "InterfaceError",
        "DisconnectionError",
        "StoreUnavailableError",
        "TransactionConflictError",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "BrokenPipeError",
        "OSError",
        "TimeoutError",
        "PoolTimeout",
        "RPCError",
    }
)


class Interrupted(Exception):
    """The busy period was interrupted; its step has been settled."""


class BudgetStop(Exception):
    """The session's budget was reached at a step boundary: nothing of the step was written."""

    def __init__(self, reached: BudgetReached) -> None:
        super().__init__(reached.describe())
        self.reached = reached


class DrainFailure(Exception):
    def __init__(self, error: SessionError) -> None:
        super().__init__(error.message)
        self.error = error


@workflow.defn
class SessionWorkflow:
    @workflow.init
    def __init__(self, input: DrainInput) -> None:
        self.session_id = input.session_id
        self.pending_wake = input.pending_wake
        self.force_requested = input.force
        self.period = input.period
        self.turns = input.turns
        # A busy period carried across continue-as-new is busy from the first activation on:
        # an interrupt or a resume handled before the run task starts must see it.
        self.busy = input.resume is not None
        self.stopping = False
        self.settling = False
        self.interrupt_reason: str | None = None
        self.outcomes: dict[int, Outcome] = {}
        self.drain_task: asyncio.Task[None] | None = None
        self.claim: ClaimRef | None = None
        self.prepared: PrepareResult | None = None  # the first drain's, from claim_and_prepare
        self._phase = "idle"
        self.step = 0
        self.attempts = 0
        self.restarts = 0  # lost turns since the last turn that completed (resume budget)
        self.turn_timeout_s = 3600
        self.retry_backoff_ms = 2000
        self.semaphore = asyncio.Semaphore(8)
        self.current_assistant: str | None = None
        self.tool_tasks: dict[tuple[str, str], asyncio.Task[ToolOutcome]] = {}
        self.running: dict[str, RunningTool] = {}
        self.approvals = Approvals()
        self.children = Children()
        self.hosts = HostCalls(changed=self._show_details)
        self.host = LOCAL_HOST  # whose queue runs the tools (the session's host, per busy period)
        self.max_active_tools = 8
        # The parent's ``task`` call this session's busy period answers (a child session).
        self.parent: ParentCall | None = None
        # The todo list as this run last saw a ``todowrite`` replace it (the UI's details).
        self.todos: tuple[Todo, ...] = ()
        # The limit that ended the last busy period (the UI's details until the next one).
        self.budget_stop: BudgetReached | None = None
        # A revert waiting for its busy period, and the answers of those that ran.
        self.revert_request: RevertRequest | None = None
        self.reverted: dict[str, RevertPlan] = {}
        # What the next model request waits for on its provider key (the governor).
        self.capacity_wait: CapacityWait | None = None

    # --- what the Temporal UI shows ---------------------------------------------------------------

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._phase = value
        self._show_details()

    def _show_details(self) -> None:
        """Keep the UI's current details in step with the drain: phase, step, running tools."""
        details = f"**{self._phase}**"
        if self.busy and self.step:
            details += f" · step {self.step} · turn {self.turns + 1}"
        if self.running:
            details += " · running " + ", ".join(t.name for t in self.running.values())
        for ask in self.approvals.waiting():
            details += f" · waiting for an answer: {ask.tool} `{ask.summary}` ({ask.request_id})"
        for host in self.hosts.waiting_hosts():
            details += f" · waiting for host {host}"
        if self.capacity_wait is not None:
            details += f" · {self.capacity_wait.describe()}"
        for child in self.children.waiting():
            details += f" · waiting for subagent {child.agent} {child.session_id}"
        if self.parent is not None:
            details += f" · subagent of {self.parent.session_id}"
        if self.budget_stop is not None and not self.busy:
            details += f" · stopped: {self.budget_stop.describe()}; raise the budget, then resume"
        if self.todos:
            marks = {"completed": "[x]", "cancelled": "[-]", "in_progress": "[>]"}
            items = [f"- {marks.get(t.status, '[ ]')} {t.content[:120]}" for t in self.todos]
            details += "\n\n**todo**\n" + "\n".join(items[:50])
        workflow.set_current_details(details)

    # --- handlers -------------------------------------------------------------------------------

    @workflow.signal
    def wake(self, _signal: Any = None) -> None:
        self.pending_wake = True

    @workflow.update
    async def resume(self, _request: ResumeRequest | None = None) -> Outcome:
        if self.busy and not self.stopping:
            target = self.period
        else:
            self.force_requested = True
            target = self.period + 1
        await workflow.wait_condition(lambda: target in self.outcomes)
        return self.outcomes[target]

    @workflow.update
    async def revert(self, request: RevertRequest) -> RevertPlan:
        """Revert (or unrevert) the session between busy periods, in a busy period of its
        own (``activities/rewind.py``); a dry run plans at once, busy or not."""
        if request.dry_run:
            return await self._revert(RevertInput(session_id=self.session_id, request=request))
        if request.request_id not in self.reverted:
            if self.busy or self._owed() or self.revert_request is not None:
                return _busy_revert(self.session_id, request)
            self.revert_request = request
        await workflow.wait_condition(lambda: request.request_id in self.reverted)
        return self.reverted[request.request_id]

    @revert.validator
    def _valid_revert(self, request: RevertRequest) -> None:
        if request.kind == "fork" and not (request.fork_session_id and request.directory):
            raise ValueError("a fork names its new session and its workspace")

    @workflow.signal(name="interrupt")
    def interrupt_signal(self, request: InterruptRequest | None = None) -> None:
        self._interrupt(request or InterruptRequest())

    @workflow.update(name="interrupt")
    def interrupt_update(self, request: InterruptRequest | None = None) -> InterruptResult:
        return InterruptResult(accepted=self._interrupt(request or InterruptRequest()))

    @workflow.signal
    def tools_ready(self, ready: ToolsReady) -> None:
        """The turn activity made these calls durable: start them while the model streams."""
        if self.claim is not None and ready.assistant_message_id == self.current_assistant:
            for call in ready.calls:
                self._start_tool(self.claim, ready.assistant_message_id, call.call_id, call.name)

    @workflow.signal
    def child_finished(self, finished: ChildFinished) -> None:
        """A child session's busy period ended; its outcome is in the store."""
        self.children.take(finished)

    @workflow.update
    def respond(self, reply: PermissionReply) -> RespondResult:
        """Answer a waiting call (the update id is the request id: a repeat is answered once)."""
        self.approvals.take(reply)
        return RespondResult(status="answered", request_id=reply.request_id)

    @respond.validator
    def _validate_respond(self, reply: PermissionReply) -> None:
        self.approvals.validate(reply)

    @workflow.signal(name="respond")
    def respond_signal(self, reply: PermissionReply) -> None:
        """The same answer when no worker took the update in time (the client checked that
        the store shows the request waiting)."""
        self.approvals.take(reply, early=True)

    @workflow.query
    def status(self) -> DrainStatus:
        return DrainStatus(
            busy=self.busy,
            stopping=self.stopping,
            phase=self.phase,
            step=self.step,
            turns=self.turns,
            execution_id=self.claim.execution_id if self.claim else None,
            running_tools=tuple(self.running.values()),
            pending_wake=self.pending_wake,
            waiting=self.approvals.waiting(),
            children=self.children.waiting(),
            host=self.host,
            waiting_hosts=self.hosts.waiting_hosts(),
            waiting_capacity=self.capacity_wait.describe() if self.capacity_wait else None,
        )

    def _interrupt(self, request: InterruptRequest) -> bool:
        if self.stopping:
            return False
        # Wakes rung before the interrupt belong to its intent, also those no busy period has
        # begun for yet (an interrupt sent while no worker polled arrives right behind them).
        self.pending_wake = False
        if not self.busy or self.settling:
            return False
        self.stopping = True
        self.interrupt_reason = request.reason
        if self.drain_task is not None:
            self.drain_task.cancel()
        for task in self.tool_tasks.values():
            task.cancel()  # the drain's cancel may be consumed by an activity that just ended
        return True

    # --- main loop ------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: DrainInput) -> None:
        if input.resume is not None:
            await self._busy_period(input.resume)
        while True:
            if not self._owed():
                # Ending: let handlers finish, unless they (or a signal) ask for more work.
                await workflow.wait_condition(lambda: self._owed() or self._handlers_done())
                if not self._owed():
                    return
                continue
            await self._busy_period()
            if workflow.info().is_continue_as_new_suggested() and not self._owed():
                # Never block on handlers while work is owed: a resume that arrived while an
                # interrupt settled waits for the next busy period, which must then start.
                await workflow.wait_condition(lambda: self._owed() or self._handlers_done())
                if not self._owed():
                    workflow.continue_as_new(self._carry())

    def _owed(self) -> bool:
        return self.pending_wake or self.force_requested or self.revert_request is not None

    @staticmethod
    def _handlers_done() -> bool:
        return workflow.all_handlers_finished()

    def _carry(self, resume: DrainResume | None = None) -> DrainInput:
        return DrainInput(
            session_id=self.session_id,
            pending_wake=self.pending_wake,
            force=self.force_requested,
            period=self.period,
            turns=self.turns,
            resume=resume,
        )

    async def _busy_period(self, resume: DrainResume | None = None) -> None:
        """One busy period (or the rest of one carried over by continue-as-new)."""
        if resume is None:
            self.period += 1
            self.force_requested, self.pending_wake, force = False, False, self.force_requested
            self.stopping, self.interrupt_reason, self.restarts = False, None, 0
        else:
            # An interrupt may already have landed in this run's first activation: keep it.
            self.attempts, self.restarts, force = resume.attempts, resume.restarts, False
            self.turn_timeout_s = resume.turn_timeout_s
            self.retry_backoff_ms = resume.retry_backoff_ms
        period = self.period
        self.busy = True
        self.prepared, self.budget_stop = None, None
        outcome = Outcome(type="succeeded")
        written = False  # the terminal is in the log already (a retried workflow task)
        try:
            # Claiming runs inside the cancellable task too: the claim may wait a whole lease
            # behind another execution, and an interrupt must not wait with it.
            self.drain_task = asyncio.create_task(self._claim_and_drain(period, force, resume))
            await self.drain_task
        except (Interrupted, asyncio.CancelledError):
            outcome = Outcome(type="interrupted", reason=self.interrupt_reason or "user")
        except BudgetStop as stop:
            self.budget_stop = stop.reached
            outcome = Outcome(type="interrupted", reason="budget")
        except DrainFailure as failure:
            outcome = _settled_as(failure.error)
        except ActivityError as error:
            if self.stopping and _stopped_by_interrupt(error, claimed=self.claim is not None):
                # The interrupt cancelled an activity that was waiting (a claim held by another
                # execution): that is the interrupt, not a failure.
                outcome = Outcome(type="interrupted", reason=self.interrupt_reason or "user")
            else:
                outcome = Outcome(type="failed", error=_activity_error(error))
            if _released(error) and self.claim is not None:
                # This busy period's own terminal released the claim in a workflow task that
                # then failed (a signal came as the task completed), and its retry met the
                # released claim. Joiners are told what the log says; a wake the first
                # attempt had not seen waits in the store, and a new busy period, with a
                # claim of its own, runs it.
                self.pending_wake = True
                stored = await self._stored_outcome(self.claim)
                if stored is not None:
                    outcome, written = stored, True
        self.settling = True
        self.phase = "settling"
        if self.claim is not None:
            outcome = Outcome(**{**outcome.model_dump(), "execution_id": self.claim.execution_id})
            parent, self.parent = self.parent, None  # told once, with the terminal
            if not written:
                await self._finish_execution(self.claim, outcome, parent)
        self.outcomes[period] = outcome
        for old in [p for p in self.outcomes if p < period - 20]:
            del self.outcomes[old]
        self.busy = self.stopping = self.settling = False
        self.claim, self.drain_task, self.phase = None, None, "idle"

    async def _claim_and_drain(self, period: int, force: bool, resume: DrainResume | None) -> None:
        revert, self.revert_request = self.revert_request, None
        claim = resume.claim if resume is not None else await self._acquire(period, force)
        self.claim = claim
        self._check_stopping()  # interrupted just as the claim was granted
        if revert is not None:
            await self._revert_period(claim, revert)
        await self._drains(claim, force, resume)

    async def _revert_period(self, claim: ClaimRef, request: RevertRequest) -> None:
        """A revert's busy period: refused when the session has work to do first (a prompt
        came, or a recovery owes the model a turn), else run on the workspace's host."""
        prep = self.prepared
        if prep is not None and prep.run:
            self.reverted[request.request_id] = _busy_revert(self.session_id, request)
            return
        self.phase = "forking" if request.kind == "fork" else "reverting"
        host = prep.host if prep is not None else request.host
        revert = RevertInput(
            session_id=self.session_id,
            request=request.model_copy(update={"host": host}),
            claim=claim,
        )
        try:
            self.reverted[request.request_id] = await self._revert(revert)
        except ActivityError as error:
            failed = RevertPlan(
                session_id=self.session_id,
                message_id=request.message_id or "",
                kind=request.kind,
                refused=f"the {request.kind} failed: {_activity_error(error).message}",
            )
            self.reverted[request.request_id] = failed
        for old in list(self.reverted)[:-20]:
            del self.reverted[old]

    async def _revert(self, request: RevertInput) -> RevertPlan:
        host = request.request.host
        queue = None if host == LOCAL_HOST else tool_queue(workflow.info().task_queue, host)
        options = replace(REVERT, task_queue=queue)
        summary = f"{request.request.kind} {request.request.message_id or ''}".strip()
        name = "fork_workspace" if request.request.kind == "fork" else "revert_workspace"
        return await call(name, request, RevertPlan, summary, options)

    async def _acquire(self, period: int, force: bool) -> ClaimRef:
        info = workflow.info()
        execution_id = f"{info.run_id}_{period}"
        self.phase = "claiming"
        request = AcquireInput(
            session_id=self.session_id,
            execution_id=execution_id,
            owner_id=f"{info.workflow_id}/{info.run_id}",  # as its activities write (run_owner)
        )
        try:
            both = ClaimAndPrepareInput(acquire=request, force=force)
            summary = "claim and prepare"
            result = await call(
                "claim_and_prepare", both, ClaimAndPrepareResult, summary, CLAIM_AT_ONCE
            )
            self.prepared = result.prep
            self.parent = result.prep.parent
            return result.claim
        except (ActivityError, ApplicationError) as error:
            failed = error if isinstance(error, ApplicationError) else error.cause
            if not isinstance(failed, ApplicationError):
                raise
            # Acquiring is idempotent per execution id: the retrying path takes over, for as
            # long as the worker's bound on a held claim says (its failure's detail).
            wait = _claim_wait(failed)
        self._check_stopping()  # a held claim is not worth waiting for once interrupted
        options = replace(CLAIM, schedule_to_close=wait)
        try:
            return await call("acquire_claim", request, ClaimRef, "claim session", options)
        except ActivityError as error:
            # The bound ran out while a retry waited (the last refusal, state TIMEOUT) or while
            # an attempt ran (a timeout failure).
            timed_out = error.retry_state == RetryState.TIMEOUT
            if not (timed_out or isinstance(error.cause, ActivityTimeoutError)):
                raise
            raise DrainFailure(_claim_timeout(self.session_id, error, wait)) from None

    async def _stored_outcome(self, claim: ClaimRef) -> Outcome | None:
        request = StoredOutcomeInput(session_id=claim.session_id, execution_id=claim.execution_id)
        try:
            stored = await call("stored_outcome", request, StoredOutcome, "read terminal", SHORT)
            return stored.outcome
        except ActivityError as error:
            workflow.logger.warning("Could not read the busy period's terminal: %s", error)
            return None

    async def _finish_execution(
        self, claim: ClaimRef, outcome: Outcome, parent: ParentCall | None = None
    ) -> None:
        """The terminal event; a child's also tells its parent (in the same activity)."""
        try:
            request = FinishExecutionInput(claim=claim, outcome=outcome, parent=parent)
            await call("finish_execution", request, type(None), f"execution {outcome.type}", SHORT)
        except ActivityError as error:
            # The claim was lost to another execution: it owns the session and its terminal.
            workflow.logger.warning("Busy period ended without its terminal event: %s", error)

    # --- the drain (reference §4.3) -------------------------------------------------------------

    async def _drains(self, claim: ClaimRef, force: bool, resume: DrainResume | None) -> None:
        if resume is None:
            await self._drain(claim, force)
        else:
            self.semaphore = asyncio.Semaphore(max(1, resume.max_active_tools))
            self.max_active_tools = max(1, resume.max_active_tools)
            self.parent = resume.parent
            self.host = resume.host
            self.hosts.lease_ms = resume.host_lease_ms
            self.turn_timeout_s = resume.turn_timeout_s
            self.retry_backoff_ms = resume.retry_backoff_ms
            limits = (resume.max_steps, resume.max_active_tools)
            await self._turns(claim, limits, resume.promotion, resume.step)
        while self.pending_wake and not self.stopping:
            self.pending_wake = False
            await self._drain(claim, False)
        self._check_stopping()

    async def _drain(self, claim: ClaimRef, force: bool) -> None:
        prep, self.prepared = self.prepared, None
        if prep is None:
            self.phase = "preparing"
            request = PrepareInput(claim=claim, force=force)
            prep = await call("prepare_drain", request, PrepareResult, "prepare drain", SHORT)
            self.parent = prep.parent or self.parent
        self._check_stopping()
        if prep.failure is not None:
            raise DrainFailure(prep.failure)
        if not prep.run:
            return
        self.host = prep.host
        self.hosts.lease_ms = prep.host_lease_ms
        if not prep.host_live:
            self.hosts.down.add(prep.host)
        self.turn_timeout_s = prep.turn_timeout_s
        self.retry_backoff_ms = prep.retry_backoff_ms
        self.semaphore = asyncio.Semaphore(max(1, prep.max_active_tools))
        self.max_active_tools = max(1, prep.max_active_tools)
        promotion = prep.promotion
        if prep.compaction is not None:
            pending = await self._barrier(claim, prep.compaction)
            if not (force or pending.steer or pending.queue):
                return
            promotion = "steer" if pending.steer else "queue" if pending.queue else None
        await self._turns(claim, (prep.max_steps, prep.max_active_tools), promotion, 1)

    async def _barrier(self, claim: ClaimRef, compaction_id: str) -> PendingResult:
        """Run the pending manual compaction; then what the prompts behind it may do."""
        await self._compact(claim, compaction_id, manual=True)
        return await self._pending(claim, None)

    async def _turns(
        self, claim: ClaimRef, limits: tuple[int | None, int], promotion: Promotion, step: int
    ) -> None:
        """User turns until nothing is pending (reference §4.3), from a given step boundary."""
        while True:
            needs, settled = True, None
            while needs:
                self._continue_as_new_if_suggested(claim, limits, promotion, step)
                needs, step, settled = await self._run_step(claim, promotion, step, limits[0])
                step += 1
                promotion = "steer"
                if not needs:
                    self._check_stopping()
                    needs = (await self._pending(claim, settled)).steer
            self._check_stopping()
            pending = await self._pending(claim, settled)
            if pending.compaction is not None:
                pending = await self._barrier(claim, pending.compaction)
            if not (pending.steer or pending.queue):
                return
            promotion, step = ("steer" if pending.steer else "queue"), 1

    def _continue_as_new_if_suggested(
        self, claim: ClaimRef, limits: tuple[int | None, int], promotion: Promotion, step: int
    ) -> None:
        """Bound history mid busy period, at a step boundary where nothing is in flight.

        Not while an update handler (a ``resume`` caller) waits for this busy period: it would
        never finish before the run ends. The history stays far below Temporal's hard limit.
        """
        if not workflow.info().is_continue_as_new_suggested() or self.stopping:
            return
        if not workflow.all_handlers_finished() or self.tool_tasks:
            return
        resume = DrainResume(
            claim=claim,
            step=step,
            promotion=promotion,
            max_steps=limits[0],
            max_active_tools=limits[1],
            attempts=self.attempts,
            restarts=self.restarts,
            turn_timeout_s=self.turn_timeout_s,
            retry_backoff_ms=self.retry_backoff_ms,
            parent=self.parent,
            host=self.host,
            host_lease_ms=self.hosts.lease_ms,
        )
        workflow.continue_as_new(self._carry(resume))

    async def _pending(self, claim: ClaimRef, settled: PendingResult | None) -> PendingResult:
        """What could be promoted: as the step settled, or (recorded runs) asked again."""
        if settled is not None:
            return settled
        request = PendingInput(claim=claim)
        return await call("pending_inputs", request, PendingResult, "check inputs", SHORT)

    async def _run_step(
        self, claim: ClaimRef, promotion: Promotion, step: int, max_steps: int | None
    ) -> tuple[bool, int, PendingResult | None]:
        """One logical step: provider attempts with retries, tools, one settlement."""
        assistant_id = f"msg_{workflow.uuid4().hex}"
        retry, compacted, recovered = 0, False, False
        while True:
            self.attempts += 1
            self.step, self.current_assistant, self.phase = step, assistant_id, "streaming"
            turn = TurnResult(assistant_message_id=assistant_id, step=step)
            try:
                self._check_stopping()
                turn = await self._stream(
                    claim, assistant_id, step, promotion, max_steps, retry, compacted
                )
                if turn.budget is not None:  # nothing was asked or promoted: stop here
                    raise BudgetStop(turn.budget)
                if turn.capacity is not None:  # nothing was asked: wait holding nothing
                    await self._wait_for_capacity(turn.capacity)
                    continue
                if turn.compact:  # nothing was asked or promoted: compact, then ask again
                    await self._compact(claim, f"cmp_{assistant_id}_{retry}", manual=False)
                    compacted = True
                    continue
                step, promotion = turn.step, None
                outcomes = await self._settle_tools(claim, assistant_id, turn.calls)
                # An interrupt may land just as the work finished: the SDK then hands back the
                # result, so the boundary decides.
                self._check_stopping()
                self.turns += 1
                if turn.lost is not None:
                    closed = await self._restart_lost(claim, turn)
                    if closed.restarted:
                        return True, step, None
                    if not closed.ended:
                        continue  # nothing of it was durable: the same step runs again
                    # Only the answer was lost: the turn had settled its step itself.
                    turn = turn.model_copy(update={"settled": closed, "lost": None})
                self.restarts = 0
                if turn.overflow and not recovered:
                    # Reference §4.4: compact once and retry the same logical step.
                    recovered = compacted = True
                    cid = f"cmp_{assistant_id}_overflow"
                    if (await self._compact(claim, cid, manual=False)).outcome == "compacted":
                        retry += 1  # the same assistant message, announced again
                        continue
                infrastructure = next(
                    (o.error for o in outcomes if o.status == "infrastructure"), None
                )
                allowed = max_steps is None or step < max_steps
                if turn.retryable and retry < MAX_RETRIES and allowed and infrastructure is None:
                    await self._schedule_retry(claim, turn, retry)
                    retry, step = retry + 1, step + 1
                    continue
            except (asyncio.CancelledError, Interrupted):
                await self._abort_step(claim, turn)
                raise Interrupted() from None
            if turn.settled is not None and not outcomes:
                result = turn.settled  # a step without local calls ended with its turn
            else:
                result = await self._finish_step(claim, turn, infrastructure=infrastructure)
            if result.failure is not None:
                raise DrainFailure(result.failure)
            return result.needs_continuation, step, result.pending

    async def _wait_for_capacity(self, wait: CapacityWait) -> None:
        """The provider key has no capacity now: a durable timer that an interrupt ends early,
        then the same step asks again (a wait is never a retry: it cannot fail the session)."""
        self.capacity_wait = wait
        self.phase = "waiting for provider capacity"
        try:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self.stopping, timeout=timedelta(milliseconds=wait.wait_ms)
                )
        finally:
            self.capacity_wait = None
        self._check_stopping()

    def _check_stopping(self) -> None:
        if self.stopping:
            raise Interrupted()

    async def _stream(
        self,
        claim: ClaimRef,
        assistant_id: str,
        step: int,
        promotion: Promotion,
        max_steps: int | None,
        retry: int,
        compacted: bool = False,
    ) -> TurnResult:
        request = TurnInput(
            claim=claim,
            assistant_message_id=assistant_id,
            step=step,
            attempt=self.attempts,
            promotion=promotion,
            max_steps=max_steps,
            retry=retry,
            skip_compaction=compacted,
        )
        bound = timedelta(seconds=self.turn_timeout_s)
        options = replace(TURN, start_to_close=bound, schedule_to_close=bound + QUEUE_WAIT)
        try:
            summary = f"turn {self.turns + 1} · step {step}"
            return await call("stream_turn", request, TurnResult, summary, options)
        except ActivityError as error:
            if isinstance(error.cause, CancelledError) and self.stopping:
                raise asyncio.CancelledError() from error
            result = TurnResult(assistant_message_id=assistant_id, step=step)
            if _lost(error):
                lost = SessionError(type="aborted", message=_lost_reason(error))
                return TurnResult(**{**result.model_dump(), "lost": lost})
            # The activity failed for a reason of its own: output may already be durable, so
            # this is never retried automatically (reference §4.6 "retry evidence").
            failed = {"raw_error": _activity_error(error), "retry_evidence": True}
            return TurnResult(**{**result.model_dump(), **failed})

    async def _compact(self, claim: ClaimRef, compaction_id: str, *, manual: bool) -> CompactResult:
        """One compaction step (DESIGN "Compaction"): the activity decides what to summarize."""
        self.phase = "compacting"
        self.attempts += 1  # fences out the turn before it, as a settlement does
        request = CompactInput(
            claim=claim, compaction_id=compaction_id, manual=manual, attempt=self.attempts
        )
        summary = f"compact {'(manual)' if manual else '(auto)'}"
        try:
            result = await call("compact", request, CompactResult, summary, COMPACT)
        except ActivityError as error:
            if isinstance(error.cause, CancelledError) and self.stopping:
                raise asyncio.CancelledError() from error
            raise
        self._check_stopping()
        return result

    async def _restart_lost(self, claim: ClaimRef, turn: TurnResult) -> FinishStepResult:
        """The turn's activity died or was handed back: close what it left, then continue.

        As a recovered execution does (reference §4.8, §5.3), but at once and under the same
        claim: open parts end with their partial text, calls that never ran fail as stale, a
        restart message asks the model to continue, within the resume budget.
        """
        self.restarts += 1
        workflow.logger.warning("Turn lost (%s), restart %d", turn.lost, self.restarts)
        restart = self.restarts <= RESUME_BUDGET
        if restart and turn.lost is not None:  # the step's error says the session went on
            lost = turn.lost.model_copy(update={"message": f"{turn.lost.message}; continued"})
            turn = turn.model_copy(update={"lost": lost})
        result = await self._finish_step(claim, turn, restart=restart)
        if result.failure is not None:
            raise DrainFailure(result.failure)
        return result

    async def _settle_tools(
        self, claim: ClaimRef, assistant_id: str, calls: tuple[CallRef, ...]
    ) -> list[ToolOutcome]:
        """Start any call whose signal was lost, then wait for every tool of the step."""
        for ref in calls:
            self._start_tool(claim, assistant_id, ref.call_id, ref.name)
        self.phase = "tools" if self.tool_tasks else self.phase
        tasks = list(self.tool_tasks.values())
        outcomes = list(await asyncio.gather(*tasks)) if tasks else []
        self.tool_tasks = {}
        return outcomes

    def _start_tool(self, claim: ClaimRef, assistant_id: str, call_id: str, name: str) -> None:
        key = (assistant_id, call_id)
        if key in self.tool_tasks or self.stopping:
            return
        request = ToolInput(
            claim=claim, assistant_message_id=assistant_id, call_id=call_id, name=name
        )
        if name == "task":
            if len(self.children.calls) >= self.max_active_tools:
                refused = (
                    f"This step already runs {len(self.children.calls)} task calls at once, the "
                    f"fan-out bound (max_active_tools = {self.max_active_tools}): wait for "
                    "their results, then call again"
                )
                request = request.model_copy(update={"refused": refused})
            else:
                self.children.calls.add(key)
        self.tool_tasks[key] = asyncio.create_task(self._run_tool(request))

    async def _run_tool(self, request: ToolInput) -> ToolOutcome:
        """Run the call; one that needs an answer waits for it holding no slot, then runs
        again carrying it. A rejection without a message stops the step (reference #61). A
        ``task`` call waits for its child session the same way."""
        try:
            outcome = await self._run_tool_once(request)
            if outcome.todos is not None:
                self.todos = outcome.todos
                self._show_details()
            if outcome.child is not None and outcome.child.background:
                self.children.background[outcome.child.session_id] = outcome.child
            while outcome.status in ("ask", "child"):
                if outcome.child is not None:
                    outcome = await self._wait_for_child(request, outcome)
                    continue
                assert outcome.ask is not None
                self._show_details()
                reply = await self.approvals.wait(outcome.ask, lambda: self.stopping)
                self._show_details()
                if reply.declined:
                    self.approvals.declined.append(reply)
                    self._interrupt(InterruptRequest(reason="rejected"))
                    raise asyncio.CancelledError()
                outcome = await self._run_tool_once(request.model_copy(update={"reply": reply}))
            return outcome
        finally:
            self.children.calls.discard((request.assistant_message_id, request.call_id))

    async def _wait_for_child(self, request: ToolInput, outcome: ToolOutcome) -> ToolOutcome:
        assert outcome.child is not None
        self._show_details()
        finished = await self.children.run(outcome.child, lambda: self.stopping)
        self._show_details()
        return await self._run_tool_once(request.model_copy(update={"child": finished}))

    async def _run_tool_once(self, request: ToolInput) -> ToolOutcome:
        async with self.semaphore:
            self.running[request.call_id] = RunningTool(
                call_id=request.call_id, name=request.name, started_at=workflow.now().isoformat()
            )
            self._show_details()
            try:
                summary = f"{request.name} {request.call_id}"
                # A task call's settlement from its child's answer is short bookkeeping: it
                # runs in the workflow's own task, like the step's.
                if request.child is not None:
                    outcome = await call("run_tool", request, ToolOutcome, summary, SHORT)
                elif self.host != LOCAL_HOST:
                    outcome = await self.hosts.run(self.host, request, TOOL)
                else:
                    outcome = await call("run_tool", request, ToolOutcome, summary, TOOL)
            except ActivityError as error:
                if isinstance(error.cause, CancelledError):
                    raise asyncio.CancelledError() from error
                outcome = ToolOutcome(
                    call_id=request.call_id, status="infrastructure", error=_activity_error(error)
                )
            finally:
                # Pure bookkeeping only: on eviction this runs outside the workflow's loop.
                self.running.pop(request.call_id, None)
            self._show_details()
            return outcome

    async def _abort_step(self, claim: ClaimRef, turn: TurnResult) -> None:
        """Interrupted: stop the tools, then settle the step durably (one ``step.failed``)."""
        self.phase = "interrupting"
        for task in self.tool_tasks.values():
            task.cancel()
        await asyncio.gather(*self.tool_tasks.values(), return_exceptions=True)
        self.tool_tasks = {}
        if self.children.active or self.children.background:
            await self.children.stop_all(f"parent {self.interrupt_reason or 'user'}")
        replies = tuple(self.approvals.declined)
        self.approvals.settle_all()
        await self._finish_step(claim, turn, interrupted=True, replies=replies)

    async def _schedule_retry(self, claim: ClaimRef, turn: TurnResult, retry: int) -> None:
        self.attempts += 1
        delay_ms = max(self.retry_backoff_ms * 2**retry, turn.retry_after_ms or 0)
        at_ms = int(workflow.now().timestamp() * 1000) + delay_ms
        request = FinishStepInput(
            claim=claim,
            attempt=self.attempts,
            turn=turn,
            retry_at_ms=at_ms,
            retry_attempt=retry + 2,
        )
        await call("finish_step", request, FinishStepResult, "schedule retry", SHORT)
        self._check_stopping()
        self.phase = "retrying"
        # A durable timer that an interrupt ends early.
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self.stopping, timeout=timedelta(milliseconds=delay_ms)
            )
        self._check_stopping()

    async def _finish_step(
        self,
        claim: ClaimRef,
        turn: TurnResult,
        *,
        interrupted: bool = False,
        infrastructure: SessionError | None = None,
        restart: bool = True,
        replies: tuple[PermissionReply, ...] = (),
    ) -> FinishStepResult:
        self.phase = "settling step"
        # A newer attempt number fences out the turn's activity: if it still runs somewhere
        # (a paused worker), its late writes are refused from here on.
        self.attempts += 1
        request = FinishStepInput(
            claim=claim,
            attempt=self.attempts,
            turn=turn,
            interrupted=interrupted,
            infrastructure_error=infrastructure,
            restart=restart,
            replies=replies,
        )
        return await call("finish_step", request, FinishStepResult, "settle step", SHORT)


def _lost(error: ActivityError) -> bool:
    """Did the activity die for a reason that says nothing about its work?"""
    cause = error.cause
    if isinstance(cause, ActivityTimeoutError | CancelledError):
        return True  # heartbeat, start-to-close; a cancel nobody asked for (worker shutdown)
    return isinstance(cause, ApplicationError) and (cause.type or "") in TRANSIENT_TYPES


# Of the transient failures, those that mean the database could not be reached.
_OUTAGE_TYPES = frozenset(
    {
        "OperationalError",
        "InterfaceError",
        "DisconnectionError",
        "StoreUnavailableError",
        "TransactionConflictError",
        "PoolTimeout",
    }
)


def _lost_reason(error: ActivityError) -> str:
    """Why a lost turn was lost, as a person reads it in ``watch`` and ``show``: the step is
    interrupted by its circumstances, not failed by the model (the raw error is in the
    workflow's history)."""
    cause = error.cause
    if isinstance(cause, ActivityTimeoutError):
        if cause.type == TimeoutType.HEARTBEAT:
            return "Step interrupted: its worker stopped answering (heartbeat timeout)"
        if cause.type == TimeoutType.START_TO_CLOSE:
            return (
                "Step interrupted: it streamed past the turn timeout (SESSIONFLOW_TURN_TIMEOUT_S)"
            )
        return (
            f"Step interrupted: its activity timed out ({cause.type.name if cause.type else '?'})"
        )
    kind = cause.type if isinstance(cause, ApplicationError) else None
    if isinstance(cause, CancelledError) or kind == "WorkerShutdown":
        return "Step interrupted: its worker shut down"
    if kind in _OUTAGE_TYPES:
        # The store's first sentence says what failed; its advice (retry) is the drain's job.
        first = str(cause.message if isinstance(cause, ApplicationError) else cause).split(". ")[0]
        return f"Step interrupted by a database outage ({first[:300]})"
    return f"Step interrupted by a lost connection ({kind})"


def _stopped_by_interrupt(error: ActivityError, *, claimed: bool) -> bool:
    """Whether an activity's failure while an interrupt stops the drain is the interrupt: its
    cancellation, or, before any claim was granted, the claim wait's last attempt (the server
    stops retrying once a cancel is requested and reports that attempt's ``ClaimHeldError``)."""
    cause = error.cause
    if isinstance(cause, CancelledError):
        return True
    return not claimed and isinstance(cause, ApplicationError) and cause.type == "ClaimHeldError"


def _busy_revert(session_id: str, request: RevertRequest) -> RevertPlan:
    why = (
        f"the session is busy: a {request.kind} runs between busy periods only; wait until "
        f"it is idle (or interrupt it), then {request.kind} again"
    )
    return RevertPlan(
        session_id=session_id, message_id=request.message_id or "", kind=request.kind, refused=why
    )


def _released(error: ActivityError) -> bool:
    cause = error.cause
    return (
        isinstance(cause, ApplicationError)
        and cause.type == "ClaimLostError"
        and CLAIM_RELEASED in str(cause)
    )


def _claim_wait(failed: ApplicationError) -> timedelta:
    """The worker's bound on waiting for a held claim (``SESSIONFLOW_CLAIM_WAIT_S``), which
    its refusal carries; the default bound when the refusal was for another reason."""
    details = failed.details if failed.type == "ClaimHeldError" else ()
    if details and isinstance(details[0], int):
        return timedelta(seconds=details[0])
    return CLAIM_WAIT


def _claim_timeout(session_id: str, error: ActivityError, wait: timedelta) -> SessionError:
    """The claim's retries ran out (C7): a typed failure naming the holder, as last seen."""
    last = error.cause
    if isinstance(last, ActivityTimeoutError):
        last = last.cause
    holder = f" ({last.message})" if isinstance(last, ApplicationError) else ""
    return SessionError(
        type="claim.timeout",
        message=(
            f"Session {session_id} stayed claimed by another execution for "
            f"{int(wait.total_seconds())} s, the bound on waiting for it "
            f"(SESSIONFLOW_CLAIM_WAIT_S){holder}. Its pending input is kept: prompt or resume "
            "the session again once that execution has ended."
        ),
    )


def _settled_as(error: SessionError) -> Outcome:
    """A drain failure as the busy period ends. A refusal on permission grounds is the user's
    decision, not a fault: the period ends interrupted (reason ``user``), as the reference's
    lifecycle settles a user-interruption failure (§7.4 #2); the step and its tool keep the
    ``permission.rejected`` error (§7.2 #64)."""
    if error.type == "permission.rejected":
        return Outcome(type="interrupted", reason="user")
    return Outcome(type="failed", error=error)


def _activity_error(error: ActivityError) -> SessionError:
    cause = error.cause
    message = str(cause) if cause is not None else str(error)
    return SessionError(type="unknown", message=message[:1000] or "Activity failed")
