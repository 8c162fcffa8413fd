"""Payloads of the drain workflow and its activities: ids, counts, short errors, never transcripts.

These are durable contracts: histories in flight hold them. New fields must be optional.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import Field

from sessionflow.models.common import Model, SessionError, Tokens
from sessionflow.models.events import Todo
from sessionflow.models.permissions import PermissionReply, PermissionRequest
from sessionflow.models.spend import BudgetReached

Promotion = Literal["steer", "queue"] | None
# Restarts of a lost turn (or recoveries of a dead execution) before the session gives up.
RESUME_BUDGET = 10
TASK_QUEUE = "sessionflow"
WORKFLOW_ID_PREFIX = "session-"
# The keyword search attribute every drain run carries: its session id.
SESSION_ID_SEARCH_ATTRIBUTE = "SessionId"


# The host of workers started without a host name: its tools run on the shared task queue
# itself, so a single machine works exactly as before hosts existed (and a tool call is
# handed straight back to the worker that scheduled it, Temporal's eager start).
LOCAL_HOST = "local"


def tool_queue(task_queue: str, host: str) -> str:
    """The task queue of ``host``'s tools: ``<task queue>@<host>``, the shared one for local."""
    return task_queue if host == LOCAL_HOST else f"{task_queue}@{host}"


def workflow_id(session_id: str) -> str:
    return f"{WORKFLOW_ID_PREFIX}{session_id}"


class ClaimRef(Model):
    """Enough of a claim for an activity to open fenced transactions under it."""

    session_id: str
    execution_id: str
    owner_id: str
    epoch: int
    lease_ms: int


# --- workflow messages --------------------------------------------------------------------------


class ParentCall(Model):
    """The ``task`` call of a parent session that a child session's busy period answers."""

    session_id: str
    assistant_message_id: str
    call_id: str
    background: bool = False


class DrainResume(Model):
    """A busy period carried across continue-as-new at a step boundary: cursors, no content."""

    claim: ClaimRef
    step: int
    promotion: Promotion = None
    max_steps: int | None = None
    max_active_tools: int = 8
    attempts: int = 0
    restarts: int = 0
    turn_timeout_s: int = 3600
    retry_backoff_ms: int = 2000
    # A child session's task call, owed the busy period's outcome (None: not a child's).
    parent: ParentCall | None = None
    host: str = LOCAL_HOST
    host_lease_ms: int = 30_000


class DrainInput(Model):
    """Start (or continue-as-new) state: flags and counters only."""

    session_id: str
    pending_wake: bool = False
    force: bool = False
    period: int = 0
    turns: int = 0
    resume: DrainResume | None = None


class ChildWait(Model):
    """A ``task`` call's child session, started: the parent waits for it holding nothing
    (``workflows/children.py``), or, in the background, goes on at once."""

    session_id: str
    agent: str
    description: str = ""
    timeout_s: float | None = None
    background: bool = False
    parent_id: str = ""


class ChildFinished(Model):
    """The ``child_finished`` signal: a child's busy period ended (its outcome is in the
    store); or, as a ``run_tool`` input, the parent stopped waiting (``timed_out``)."""

    child_session_id: str
    outcome: str = "succeeded"
    error: str | None = None
    timed_out: bool = False
    # The seq of the child's terminal event, once read from the store (``answered``).
    seq: int | None = None


class ReportInput(Model):
    """A child's busy period ended: tell its parent."""

    parent: ParentCall
    child_session_id: str
    description: str = ""
    outcome: str = "succeeded"
    error: str | None = None


class WakeSignal(Model):
    input_id: str | None = None


class InterruptRequest(Model):
    reason: str = "user"
    request_id: str | None = None


class InterruptResult(Model):
    accepted: bool


class Outcome(Model):
    """The terminal outcome of one busy period."""

    type: Literal["succeeded", "failed", "interrupted"]
    reason: str | None = None
    error: SessionError | None = None
    execution_id: str | None = None


class ResumeRequest(Model):
    request_id: str | None = None


class RevertRequest(Model):
    """A revert of the session's conversation and workspace to ``message_id`` (the last
    message kept), an ``unrevert`` of the last one, or a ``fork``: a new session
    (``fork_session_id``) with the history up to ``message_id`` and a copy of the workspace
    as it was then, in ``directory``. ``force``: paths restored (or left as they are)
    although a refusal names them; ``dry_run``: the plan only."""

    request_id: str
    kind: Literal["revert", "unrevert", "fork"] = "revert"
    message_id: str | None = None
    dry_run: bool = False
    force: tuple[str, ...] = ()
    host: str = "local"  # where the workspace is, as the session said when asked
    directory: str | None = None  # a fork's workspace (absolute, on the session's host)
    fork_session_id: str | None = None


class RevertInput(Model):
    """The ``revert_workspace`` activity's input: under ``claim`` (None for a dry run)."""

    session_id: str
    request: RevertRequest
    claim: ClaimRef | None = None


class RunningTool(Model):
    call_id: str
    name: str
    started_at: str


class DrainStatus(Model):
    busy: bool
    stopping: bool = False
    phase: str = "idle"
    step: int = 0
    turns: int = 0
    execution_id: str | None = None
    running_tools: tuple[RunningTool, ...] = ()
    pending_wake: bool = False
    # Calls waiting for a person: permission asks and questions.
    waiting: tuple[PermissionRequest, ...] = ()
    # Child sessions the busy period's ``task`` calls wait on.
    children: tuple[ChildWait, ...] = ()
    host: str = LOCAL_HOST
    # Hosts a running call waits for: their workers stopped answering (restarting, or gone).
    waiting_hosts: tuple[str, ...] = ()
    # The provider capacity the next model request waits for (``CapacityWait.describe``).
    waiting_capacity: str | None = None


# --- activities ---------------------------------------------------------------------------------


class AcquireInput(Model):
    session_id: str
    execution_id: str
    owner_id: str


class PrepareInput(Model):
    claim: ClaimRef
    force: bool


class ClaimAndPrepareInput(Model):
    """A busy period's claim and its first drain's preparation, in one local activity."""

    acquire: AcquireInput
    force: bool


class PrepareResult(Model):
    run: bool
    promotion: Promotion = None
    max_steps: int | None = None
    max_active_tools: int = 8
    stale_tools: int = 0
    failure: SessionError | None = None
    # A manual compaction waits at the barrier: it runs before anything else.
    compaction: str | None = None
    # The bound on one model turn (``SESSIONFLOW_TURN_TIMEOUT_S``): the worker's setting, handed
    # to the workflow, which holds no settings of its own.
    turn_timeout_s: int = 3600
    # The first provider retry's delay (``SESSIONFLOW_RETRY_BACKOFF_MS``), doubling per retry.
    retry_backoff_ms: int = 2000
    # The session is a child whose ``task`` call waits for this busy period's outcome.
    parent: ParentCall | None = None
    # The host whose queue runs the session's tools, and whether it had a live worker.
    host: str = LOCAL_HOST
    host_live: bool = True
    # How long the host's silent workers count as running (``SESSIONFLOW_HOST_LEASE_MS``).
    host_lease_ms: int = 30_000


class ClaimAndPrepareResult(Model):
    claim: ClaimRef
    prep: PrepareResult


class PendingInput(Model):
    claim: ClaimRef


class StoredOutcomeInput(Model):
    """A busy period whose terminal an earlier attempt of the same workflow task wrote."""

    session_id: str
    execution_id: str


class StoredOutcome(Model):
    outcome: Outcome | None = None  # None: no terminal of that execution in the log


class PendingResult(Model):
    steer: bool
    queue: bool
    compaction: str | None = None  # a pending manual compaction (prompts wait behind it)


class TurnInput(Model):
    claim: ClaimRef
    assistant_message_id: str
    step: int
    attempt: int = Field(description="fencing token of this step attempt, increasing per drain")
    promotion: Promotion = None
    max_steps: int | None = None
    retry: int = 0
    # Set once the workflow compacted (or tried to) before this request: no second check.
    skip_compaction: bool = False


class CallRef(Model):
    call_id: str
    name: str


class ToolsReady(Model):
    """Calls of one step whose ``tool.called`` is durable: the ``tools_ready`` signal."""

    assistant_message_id: str
    calls: tuple[CallRef, ...]


class CapacityWait(Model):
    """The provider key had no capacity for the request: nothing was asked; ask again in
    ``wait_ms`` (by then the key may have capacity)."""

    key: str
    wait_ms: int
    until_ms: int  # epoch ms, database clock
    reason: str

    def describe(self) -> str:
        until = datetime.fromtimestamp(self.until_ms / 1000, tz=UTC).strftime("%H:%M:%S UTC")
        return f"waiting for provider capacity (key {self.key}, until {until}: {self.reason})"


class TurnResult(Model):
    assistant_message_id: str
    step: int
    started: bool = False
    finish: str | None = None
    tokens: Tokens | None = None
    cost: float | None = None  # USD; None when unpriced
    # The session's budget stopped it before this step asked anything.
    budget: BudgetReached | None = None
    # No capacity on the provider key: nothing was asked, the workflow waits and asks again.
    capacity: CapacityWait | None = None
    calls: tuple[CallRef, ...] = ()
    step_failure: SessionError | None = None
    provider_failed: bool = False
    raw_error: SessionError | None = None
    retryable: bool = False
    retry_after_ms: int | None = None
    retry_evidence: bool = False
    # The turn's activity died or was handed back (a killed worker, a deploy, a timeout): what
    # it streamed is durable up to its last flush, and the step is restarted (DESIGN "A dead
    # turn is not a failed turn").
    lost: SessionError | None = None
    # No request was made: the history would not fit the window, compact first.
    compact: bool = False
    # The provider said the request did not fit (before any output): compact and retry once.
    overflow: bool = False
    # A step without local calls, settled by the turn itself as ``finish_step`` would have:
    # the workflow needs no settlement activity (None: it settles the step as before).
    settled: FinishStepResult | None = None


class CompactInput(Model):
    claim: ClaimRef
    compaction_id: str  # the input id of a manual compaction, the workflow's id of an auto one
    manual: bool = False
    attempt: int = Field(description="fencing token, as a turn's")


class CompactResult(Model):
    outcome: Literal["compacted", "not-compacted", "failed"]
    error: SessionError | None = None


class ToolInput(Model):
    claim: ClaimRef
    assistant_message_id: str
    call_id: str
    name: str
    # The answer to the call's ask: the call runs (once, always) or is refused (reject).
    reply: PermissionReply | None = None
    # A ``task`` call whose child finished (or was waited for long enough): settle it.
    child: ChildFinished | None = None
    # Why the workflow refuses the call before it starts (a bound of the session tree).
    refused: str | None = None
    # Attempts of earlier activities for this call (a call rescheduled on its host's queue
    # after its schedule-to-start timeout): the attempt fence counts on from them.
    attempt_base: int = 0


class WorkspaceCheckInput(Model):
    """A workspace to check on the host that will run the session's tools."""

    directory: str


class WorkspaceCheckResult(Model):
    host: str
    directory: str | None = None  # made absolute on the host; None when the check failed
    error: str | None = None
    instructions: dict[str, str] | None = None  # the instruction files it holds, as read there


class HostStateInput(Model):
    host: str


class HostStateResult(Model):
    host: str
    status: Literal["live", "late", "gone"]
    ever: bool = True
    seen_ms_ago: int | None = None


class UnreachableInput(Model):
    """Settle a call whose host has no live worker (from the shared queue)."""

    tool: ToolInput
    host: str
    attempt: int  # above every attempt the host's workers made, fencing them out


class ToolOutcome(Model):
    call_id: str
    status: Literal["completed", "error", "interrupted", "infrastructure", "ask", "child"]
    error: SessionError | None = None
    # status "ask": nothing ran; the call waits for a reply to this.
    ask: PermissionRequest | None = None
    # status "child": a child session runs the call; the call waits for it.
    child: ChildWait | None = None
    # The session's todo list, when the call replaced it (``todowrite``), for the UI's details.
    todos: tuple[Todo, ...] | None = None


class FinishStepInput(Model):
    claim: ClaimRef
    attempt: int
    turn: TurnResult
    interrupted: bool = False
    infrastructure_error: SessionError | None = None
    retry_at_ms: int | None = None
    retry_attempt: int | None = None
    # For a lost turn: False once the resume budget is spent (the drain then fails).
    restart: bool = True
    # Replies that stopped the step (a rejection without a message): recorded with it.
    replies: tuple[PermissionReply, ...] = ()


class FinishStepResult(Model):
    ended: bool
    failure: SessionError | None = None
    needs_continuation: bool = False
    # What could be promoted as the step settled, when it ended the user turn (None: not asked).
    pending: PendingResult | None = None
    # A lost turn was closed and a restart message recorded: the next step continues it.
    restarted: bool = False


TurnResult.model_rebuild()  # its ``settled`` names FinishStepResult, defined after it


class FinishExecutionInput(Model):
    claim: ClaimRef
    outcome: Outcome
    keep_claim: bool = False
    # A child session's busy period: the parent's call it answers, told once the terminal is
    # written (``activities/children.py::report``).
    parent: ParentCall | None = None


# --- recovery sweep -----------------------------------------------------------------------------

SWEEP_WORKFLOW_ID = "sessionflow-recovery-sweep"


def sweep_schedule_id(task_queue: str, store_key: str) -> str:
    """One recovery sweep per deployment (a task queue and the store its workers write to),
    however many share a Temporal namespace: the Schedule's id, also its workflows' id."""
    return f"{SWEEP_WORKFLOW_ID}-{task_queue}-{store_key}"


class SweepInput(Model):
    limit: int = 50
    # Passes in one run, ``every_s`` apart: the Schedule starts a run every 30 s that passes
    # every 3 s, so a terminated drain is noticed in seconds while the UI lists one run per 30 s.
    rounds: int = Field(default=1, ge=1, le=100)
    every_s: float = Field(default=3.0, gt=0)


class SweepResult(Model):
    woken: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
