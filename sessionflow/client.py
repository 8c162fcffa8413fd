"""``SessionClient``: the SDK that users, the CLI and external checks use.

Input is admitted durably in the store first, then the session's drain workflow is woken
(signal-with-start), so a prompt survives workers that are down. Events are read and followed
from the store, never from Temporal.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar

from pydantic import ValidationError
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from sessionflow import locate, telemetry, validate
from sessionflow.agents import Agents, load_agents
from sessionflow.catalogue import ToolInfo
from sessionflow.errors import (
    InvalidInputError,
    NoWorkerError,
    RequestNotWaitingError,
    StoreMismatchError,
    WrongRequestKindError,
)
from sessionflow.ids import session_id as session_id_of_fork
from sessionflow.ids import validate_id
from sessionflow.models import events as ev
from sessionflow.models.common import (
    CompactionSettings,
    Delivery,
    ModelRef,
    Prompt,
)
from sessionflow.models.drain import (
    LOCAL_HOST,
    SESSION_ID_SEARCH_ATTRIBUTE,
    TASK_QUEUE,
    DrainInput,
    DrainStatus,
    InterruptRequest,
    InterruptResult,
    Outcome,
    ResumeRequest,
    RevertRequest,
    WakeSignal,
    workflow_id,
)
from sessionflow.models.events import AgentSelected
from sessionflow.models.journal import RevertPlan, visible
from sessionflow.models.messages import AssistantMessage, Message, ToolPart, ToolRunning
from sessionflow.models.permissions import (
    Decision,
    PermissionReply,
    PermissionRequest,
    RespondResult,
    Rule,
)
from sessionflow.models.spend import Budget, BudgetReached, Spend
from sessionflow.placement import place
from sessionflow.settings import Settings
from store import Store, open_store
from store.events import StoredEvent
from store.hosts import HostWorker
from store.inputs import InputReceipt
from store.sessions import SessionInfo

SESSION_ID_ATTRIBUTE = SearchAttributeKey.for_keyword(SESSION_ID_SEARCH_ATTRIBUTE)
WORKFLOW_TYPE = "SessionWorkflow"
# Tools of one turn run as activities, at most this many at once; the workflow schedules one
# only when a slot is free, so a turn with more calls than that waits instead of reaching
# Temporal's limit of 2,000 pending activities per workflow (catalogue D6).
MAX_ACTIVE_TOOLS = 1000
# A live worker long-polls its task queue about once a minute; one not seen for longer is gone.
# (A worker of this host whose process has exited is gone at once: ``locate.gone``.)
WORKER_SEEN_S = 90
ANSWER_TIMEOUT = timedelta(seconds=5)  # how long a query or an interrupt waits for a worker
# A worker that just started polls within moments: look this long before saying there is none.
NO_WORKER_GRACE_S = 1.0
# A look that found no worker is believed this long: a command that asks twice (status, then
# resume) waits out the grace once, and answers within 3 s with no worker.
NO_WORKER_MEMORY_S = 5.0
# How the server's describe of a task queue fails when it answers too late (ANSWER_TIMEOUT).
_SLOW_ANSWERS = (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED)
SLOW_ANSWER_TRIES = 4
T = TypeVar("T")
# Starts of a drain on a server without the SessionId search attribute, registering it between.
UNREGISTERED_TRIES = 4


@dataclass(frozen=True)
class Interruption:
    """What an interrupt request did. True only when it is known to have stopped the work.

    - ``stopped``: this request stopped the running busy period (its terminal event is
      ``execution.interrupted``);
    - ``idle``: nothing was running, or another request is already stopping it;
    - ``sent``: no worker answered in time: the interrupt is queued in the workflow until a
      worker is back, and then comes first: it stops the busy period, and the wakes rung
      before it (prompts not yet run) are claimed by it, so those prompts stay pending until
      the next prompt or resume.
    """

    status: Literal["stopped", "idle", "sent"]
    # For ``sent``: why no worker answered (``NoWorkerError``'s message), when that is known.
    detail: str | None = None

    def __bool__(self) -> bool:
        return self.status == "stopped"


@dataclass(frozen=True)
class ClientEvent:
    """A stored event as the SDK shows it: unversioned type, fields as a dict."""

    seq: int
    id: str
    type: str
    created: int
    data: dict[str, Any]

    @classmethod
    def of(cls, stored: StoredEvent) -> ClientEvent:
        return cls(
            seq=stored.seq,
            id=stored.id,
            type=stored.data.type,
            created=stored.created,
            data=stored.data.model_dump(mode="json"),
        )


@dataclass(frozen=True)
class SessionStatus:
    session_id: str
    busy: bool
    drain: DrainStatus | None
    pending_inputs: int
    # Set when the session has work but no worker to do it: what to start, and where.
    waiting_for_worker: str | None = None
    # The child sessions its ``task`` calls wait on, as they are now (theirs inside).
    subagents: tuple[SessionStatus, ...] = ()
    # The session's own spend (``usage`` adds its subagents').
    spend: Spend = field(default_factory=Spend)
    budget: Budget | None = None
    # The limit its spend has reached: no model request starts until the budget is raised.
    budget_reached: BudgetReached | None = None

    def asks(self) -> list[tuple[str, PermissionRequest]]:
        """Every call of the tree below and including this session that waits for a person:
        (session id, request); answer each through its own session."""
        own = [(self.session_id, r) for r in (self.drain.waiting if self.drain else ())]
        return own + [ask for child in self.subagents for ask in child.asks()]

    @property
    def idle(self) -> bool:
        """Idle now: no busy period runs and none is about to, so nothing will happen until
        the next prompt or resume. Work that waits for a worker is not idle, nor is a rung
        doorbell or an input that the open run will pick up."""
        if self.busy or self.waiting_for_worker or (self.drain and self.drain.pending_wake):
            return False
        return not (self.drain is not None and self.pending_inputs)


@dataclass(frozen=True)
class Usage:
    """What a session spent, and its subagents below it: ``own`` is the session's alone,
    ``total`` includes every descendant's."""

    session_id: str
    agent: str | None
    own: Spend
    total: Spend
    children: tuple[Usage, ...] = ()


@dataclass(frozen=True)
class Job:
    """A background task of a session: its child session, whether it runs now, and how its
    last busy period ended (None before the first ended)."""

    session: SessionInfo
    running: bool
    outcome: str | None


class SessionClient:
    def __init__(
        self,
        client: Client,
        store: Store,
        *,
        task_queue: str = TASK_QUEUE,
        agents: Agents | None = None,
        host: str = LOCAL_HOST,
    ) -> None:
        self.temporal = client
        self.store = store
        self.task_queue = task_queue
        self.agents = agents or Agents()
        self.host = host  # where new sessions are placed (``SESSIONFLOW_HOST``)
        # When a full look found no worker on a queue: one command asks once (``_polled``).
        self._unpolled: dict[str, float] = {}

    @classmethod
    async def connect(
        cls,
        *,
        temporal_address: str = "127.0.0.1:7233",
        database_url: str | None = None,
        task_queue: str = TASK_QUEUE,
        namespace: str = "default",
        client: Client | None = None,
        store: Store | None = None,
    ) -> SessionClient:
        if client is None:
            client = await Client.connect(
                temporal_address,
                namespace=namespace,
                data_converter=pydantic_data_converter,
                interceptors=telemetry.interceptors(),
            )
        settings = Settings.from_env()
        if store is None:
            url = locate.database_url(database_url, address=temporal_address, task_queue=task_queue)
            store = await open_store(url, settings=settings)
        agents = load_agents(settings.agents_file)
        return cls(client, store, task_queue=task_queue, agents=agents, host=settings.host)

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.store.close()

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        workspace: str,
        model: str | ModelRef,
        max_active_tools: int = 8,
        max_steps: int | None = None,
        system: str | None = None,
        title: str = "",
        session_id: str | None = None,
        compaction: CompactionSettings | dict[str, Any] | None = None,
        agent: str | None = None,
        permissions: Sequence[Rule | dict[str, Any]] = (),
        network: bool = False,
        approval_timeout: float | None = None,
        mcp: Mapping[str, bool] | None = None,
        host: str | None = None,
        budget: Budget | Mapping[str, float] | None = None,
    ) -> str:
        """Create a session; its workspace and model are checked and made absolute first (a
        relative path is the caller's, not the worker's): a missing or non-directory workspace,
        an unknown provider or a script that does not load is an ``InvalidInputError``.

        ``host`` (default: this client's, else ``local``) places it: its tools run on that
        host's workers, which check the workspace where it lives (``sessionflow/placement``).

        ``mcp`` turns the workers' configured MCP servers (``SESSIONFLOW_MCP``) on or off for
        this session by name; a server it does not name keeps its configured ``enabled``.

        ``budget`` (``{"usd": 2.0, "tokens": 500000}``, either or both) pauses the session at
        the first step boundary where its spend reaches a limit (``set_budget``)."""
        if session_id is not None:
            validate_id(session_id)  # the cheapest check first: before any file is read
        if not 1 <= max_active_tools <= MAX_ACTIVE_TOOLS:
            raise ValueError(
                f"max_active_tools must be between 1 and {MAX_ACTIVE_TOOLS}, got "
                f"{max_active_tools} (a workflow may hold at most 2,000 pending activities)"
            )
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        settings: dict[str, Any] = {"max_active_tools": max_active_tools}
        if max_steps is not None:
            settings["max_steps"] = max_steps
        if system:
            settings["system"] = system
        if compaction is not None:
            chosen = CompactionSettings.model_validate(compaction).model_dump(exclude_defaults=True)
            if chosen:  # the defaults are not stored: they may improve later
                settings["compaction"] = chosen
        if agent is not None:
            self.agents.get(agent)  # an unknown name is an error here, at the edge
        rules = [Rule.model_validate(r).model_dump(mode="json") for r in permissions]
        optional = {
            "permissions": rules,
            "network": network,
            "approval_timeout": approval_timeout,
            "mcp": _mcp_choices(mcp),
        }
        settings.update({key: value for key, value in optional.items() if value})
        limits = _budget(budget)
        if limits is not None:
            settings["budget"] = limits.model_dump(mode="json", exclude_none=True)
        ref = validate.model(model)
        await self._require_same_store()
        where = await place(
            self.temporal, self.store, self.task_queue, host or self.host, workspace
        )
        info = await self.store.sessions.create(
            where.directory,
            session_id=session_id,
            title=title,
            model=ref,
            settings=settings,
            agent=agent,
            host=where.host,
            observed=where.observed,
        )
        return info.id

    async def set_budget(
        self, session_id: str, budget: Budget | Mapping[str, float] | None
    ) -> SessionInfo:
        """Replace the session's spending limits (``None`` or ``{}``: none). It applies at the
        next step boundary; a session a budget stopped continues with ``resume`` once its
        spend is below the new limits (``status`` says which limit stopped it)."""
        limits = _budget(budget)
        await self.store.sessions.get(session_id)
        await self.store.events.publish(ev.BudgetSet(session_id=session_id, budget=limits))
        return await self.store.sessions.get(session_id)

    async def move(
        self, session_id: str, host: str, *, workspace: str | None = None
    ) -> SessionInfo:
        """Move the session's tools to ``host`` (and ``workspace`` there; default: the same
        path), between busy periods only (``SessionBusyError``); recorded as ``session.moved``.
        The new host checks the workspace first, as at creation."""
        info = await self.store.sessions.get(session_id)
        where = await place(
            self.temporal, self.store, self.task_queue, host, workspace or info.directory
        )
        return await self.store.sessions.move(
            session_id, where.host, where.directory, observed=where.observed
        )

    async def hosts(self) -> list[HostWorker]:
        """Every host's worker leases, most recently seen first (``store/hosts.py``)."""
        return await self.store.hosts.workers()

    async def session(self, session_id: str) -> SessionInfo:
        return await self.store.sessions.get(session_id)

    async def tools(self, session_id: str | None = None) -> list[ToolInfo]:
        """What ``session_id``'s agent can call (every configured tool without one), as a
        worker configured like this process offers it (``sessionflow.catalogue``)."""
        from sessionflow.catalogue import session_tools

        session = await self.store.sessions.get(session_id) if session_id else None
        tools, _unavailable = await session_tools(session, self.agents)
        return tools

    async def list_sessions(self, *, roots: bool = False, **filters: Any) -> list[SessionInfo]:
        """Sessions, most recently updated first; ``roots=True`` leaves out child sessions
        (those a ``task`` call started)."""
        if roots:
            filters["roots_only"] = True
        return await self.store.sessions.list(**filters)

    async def children(self, session_id: str) -> list[SessionInfo]:
        """The child sessions of ``session_id``'s ``task`` calls, oldest first."""
        await self.store.sessions.get(session_id)
        found = await self.store.sessions.list(parent_id=session_id, limit=10_000)
        return sorted(found, key=lambda child: (child.time_created, child.id))

    async def jobs(self, session_id: str) -> list[Job]:
        """The session's background tasks (``task`` with ``background``), each with whether
        it runs now and how its last busy period ended."""
        jobs = []
        for child in await self.children(session_id):
            task = child.settings.get("task") or {}
            if not task.get("background"):
                continue
            terminal = await self._last_terminal(child.id)
            running = (await self.status(child.id)).busy
            jobs.append(Job(child, running, terminal))
        return jobs

    async def usage(self, session_id: str) -> Usage:
        """The session's tokens and cost, each child's (theirs inside), and the tree's total."""
        info = await self.store.sessions.get(session_id)
        below = tuple([await self.usage(child.id) for child in await self.children(info.id)])
        total = info.spend
        for child in below:
            total += child.total
        agent = info.agent or self.agents.default
        return Usage(info.id, agent, info.spend, total, below)

    async def _last_terminal(self, session_id: str) -> str | None:
        ended = [
            await self.store.events.latest_of(session_id, kind)
            for kind in (ev.ExecutionSucceeded, ev.ExecutionFailed, ev.ExecutionInterrupted)
        ]
        latest = max((e for e in ended if e is not None), key=lambda e: e.seq, default=None)
        return latest.data.type.rsplit(".", 1)[-1] if latest is not None else None

    async def messages(self, session_id: str, *, hidden: bool = False) -> list[Message]:
        """The session's messages; those a staged revert hides only with ``hidden``."""
        info = await self.store.sessions.get(session_id)  # unknown: an error, not empty
        messages = await self.store.sessions.messages(session_id)
        return messages if hidden else visible(messages, info.settings)

    # --- rewind ---------------------------------------------------------------------------------

    async def revert(
        self,
        session_id: str,
        message_id: str,
        *,
        dry_run: bool = False,
        force: Sequence[str] = (),
    ) -> RevertPlan:
        """Put the session's workspace and conversation back to ``message_id`` (the last
        message kept): the files the calls after it changed are restored (created ones
        deleted) and the later messages hidden, until ``unrevert`` or the next prompt (which
        makes it permanent). Between busy periods only. A path changed since by someone else,
        or whose earlier content the journal lacks, refuses the whole revert (``refusals``)
        unless named in ``force``; ``dry_run`` only says what would happen."""
        request = RevertRequest(
            request_id=f"revert-{uuid.uuid4()}",
            message_id=message_id,
            dry_run=dry_run,
            force=tuple(force),
        )
        return await self._revert(session_id, request)

    async def unrevert(self, session_id: str, *, force: Sequence[str] = ()) -> RevertPlan:
        """Undo the last revert while no prompt came after it (files and messages)."""
        request = RevertRequest(
            request_id=f"unrevert-{uuid.uuid4()}", kind="unrevert", force=tuple(force)
        )
        return await self._revert(session_id, request)

    async def fork(
        self,
        session_id: str,
        message_id: str,
        *,
        workspace: str,
        dry_run: bool = False,
        force: Sequence[str] = (),
        fork_id: str | None = None,
    ) -> RevertPlan:
        """A new session (``fork_session_id`` of the plan) with this one's history up to
        ``message_id`` (kept) and a copy of its workspace as it was then, in ``workspace``:
        a new directory on the session's host (a relative path is the caller's, on the
        ``local`` host only). The source is not changed; between its busy periods only. A
        path whose content then the journal lacks refuses the fork unless named in
        ``force`` (the copy keeps it as it is now); ``dry_run`` only says what would happen."""
        new = validate_id(fork_id) if fork_id is not None else session_id_of_fork()
        info = await self.store.sessions.get(session_id)
        request = RevertRequest(
            request_id=f"fork-{uuid.uuid4()}",
            kind="fork",
            message_id=message_id,
            dry_run=dry_run,
            force=tuple(force),
            directory=validate.new_workspace(workspace, info.host),
            fork_session_id=new,
        )
        return await self._revert(session_id, request)

    async def _revert(self, session_id: str, request: RevertRequest) -> RevertPlan:
        info = await self.store.sessions.get(session_id)
        request = request.model_copy(update={"host": info.host})
        queue = await self._queue(session_id) or self.task_queue
        await self._require_worker(session_id, queue)

        def start() -> Awaitable[WorkflowUpdateHandle[Any]]:
            operation: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
                WORKFLOW_TYPE,
                DrainInput(session_id=session_id),
                id=workflow_id(session_id),
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                search_attributes=_attributes(session_id),
                static_summary=_summary(info),
            )
            return self.temporal.start_update_with_start_workflow(
                "revert",
                request,
                start_workflow_operation=operation,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                result_type=RevertPlan,
                rpc_timeout=3 * ANSWER_TIMEOUT,
                id=request.request_id,
            )

        handle = await asyncio.shield(self._registering(start))
        plan = await handle.result()
        assert isinstance(plan, RevertPlan)
        return plan

    # --- control --------------------------------------------------------------------------------

    async def prompt(
        self,
        session_id: str,
        text: str | Prompt,
        *,
        delivery: Delivery = "steer",
        input_id: str | None = None,
        wake: bool = True,
    ) -> InputReceipt:
        """Admit the prompt durably, then wake the session (unless ``wake=False``)."""
        receipt = await self.store.inputs.admit(
            session_id, text, input_id=input_id, delivery=delivery
        )
        if wake:
            await self.wake(session_id, input_id=receipt.id)
        return receipt

    async def set_context(self, session_id: str, key: str, text: str) -> None:
        """Set a context entry of the session's system context (``<context key=…>``).

        The first request freezes the system context; a later change reaches the model as a
        system message in the conversation, so the frozen part (and the provider's prompt
        cache) stays as it was.
        """
        validate_id(key, "context key")
        await self.store.sessions.get(session_id)
        await self.store.events.publish(ev.ContextSet(session_id=session_id, key=key, text=text))

    async def delete_context(self, session_id: str, key: str) -> None:
        validate_id(key, "context key")
        await self.store.sessions.get(session_id)
        await self.store.events.publish(ev.ContextDeleted(session_id=session_id, key=key))

    async def compact(self, session_id: str) -> str:
        """Compact the session's history at its next step boundary; returns the input id.

        A second request while one is pending returns the pending one's id. Prompts admitted
        after it wait behind it (the barrier) and run in order once it is done.
        """
        input_id = await self.store.inputs.admit_compaction(session_id)
        await self.wake(session_id, input_id=input_id)
        return input_id

    async def wake(self, session_id: str, *, input_id: str | None = None) -> None:
        info = await self.store.sessions.get(session_id)
        await self._registering(
            lambda: self.temporal.start_workflow(
                WORKFLOW_TYPE,
                DrainInput(session_id=session_id),
                id=workflow_id(session_id),
                task_queue=self.task_queue,
                start_signal="wake",
                start_signal_args=[WakeSignal(input_id=input_id)],
                search_attributes=_attributes(session_id),
                static_summary=_summary(info),
            )
        )

    async def _registering(self, start: Callable[[], Awaitable[T]]) -> T:
        """``start()``, a drain's start; on a Temporal server that no worker or ``dev`` has
        prepared yet, the ``SessionId`` search attribute is registered first, then it is
        started again (without, a prompt sent before any worker ran failed)."""
        for attempt in range(UNREGISTERED_TRIES):
            try:
                return await start()
            except RPCError as error:
                unknown = "no mapping defined for search attribute" in str(error)
                if not unknown or attempt == UNREGISTERED_TRIES - 1:
                    raise
                from sessionflow.devstack import ensure_search_attribute

                await ensure_search_attribute(self.temporal, self.temporal.namespace)
                await asyncio.sleep(0.2 * attempt)  # the server may take a moment to apply it
        raise AssertionError("unreachable")

    async def resume(self, session_id: str) -> Outcome:
        """Run a busy period now, or join the running one; returns its outcome.

        Like the reference's explicit resume, this forces a drain: with nothing pending it asks
        the model once more on the existing history (one turn). With no worker polling the
        task queue it raises ``NoWorkerError`` and starts nothing; when no worker takes the
        request within a few seconds, ``NoWorkerError(sent=True)``: it runs when one polls.
        """
        # Once asked, the busy period starts even if the caller stops waiting meanwhile (an
        # HTTP long-poll that answers 202): only the wait for its outcome is cancellable.
        handle = await asyncio.shield(self._start_resume(session_id))
        outcome = await handle.result()
        assert isinstance(outcome, Outcome)
        return outcome

    async def _start_resume(self, session_id: str) -> WorkflowUpdateHandle[Any]:
        info = await self.store.sessions.get(session_id)
        queue = await self._queue(session_id) or self.task_queue
        await self._require_worker(session_id, queue)
        request = ResumeRequest(request_id=str(uuid.uuid4()))

        def start() -> Awaitable[WorkflowUpdateHandle[Any]]:
            operation: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
                WORKFLOW_TYPE,
                DrainInput(session_id=session_id),
                id=workflow_id(session_id),
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                search_attributes=_attributes(session_id),
                static_summary=_summary(info),
            )  # one use each: a retry needs its own
            return self.temporal.start_update_with_start_workflow(
                "resume",
                request,
                start_workflow_operation=operation,
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
                result_type=Outcome,
                rpc_timeout=3 * ANSWER_TIMEOUT,
            )

        try:
            return await self._registering(start)
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            pending = len(await self.store.inputs.pending(session_id))
            raise NoWorkerError(queue, pending, sent=True) from None

    async def interrupt(
        self, session_id: str, reason: str = "user", *, request_id: str | None = None
    ) -> Interruption:
        """Stop the running busy period; see ``Interruption`` for what the answer means.

        The answer comes from an update (its id is the request id, so a repeat is answered
        once). When no worker answers in time, the interrupt is sent as a durable signal that
        takes effect when a worker is back, and the answer says it was only sent.
        """
        await self.store.sessions.get(session_id)  # an unknown session is an error, not idle
        interruption = await self._interrupt_drain(session_id, reason, request_id)
        await self._interrupt_jobs(session_id, reason)
        return interruption

    async def _interrupt_drain(
        self, session_id: str, reason: str, request_id: str | None
    ) -> Interruption:
        request_id = request_id or f"interrupt-{uuid.uuid4()}"
        request = InterruptRequest(reason=reason, request_id=request_id)
        handle = self._handle(session_id)
        queue = await self._queue(session_id, running_only=True)
        if queue is None:
            return Interruption("idle")  # no open run: nothing to interrupt
        if not await self._polled(queue):
            await handle.signal("interrupt", request)
            pending = len(await self.store.inputs.pending(session_id))
            return Interruption("sent", _queued(queue, pending))
        try:
            result = await handle.execute_update(
                "interrupt",
                request,
                id=request_id,
                result_type=InterruptResult,
                rpc_timeout=2 * ANSWER_TIMEOUT,
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            await handle.signal("interrupt", request)
            pending = len(await self.store.inputs.pending(session_id))
            return Interruption("sent", _queued(queue, pending, polled=True))
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return Interruption("idle")  # the run closed meanwhile
            raise
        except Exception as error:
            if "already completed" in str(error):
                return Interruption("idle")
            raise
        return Interruption("stopped" if result.accepted else "idle")

    async def _interrupt_jobs(self, session_id: str, reason: str) -> None:
        """Interrupting a session cancels its background tasks, and theirs (the reference's
        cancel-background-jobs rule); the tasks it waits on its workflow interrupts itself."""
        for child in await self.store.sessions.list(parent_id=session_id, limit=10_000):
            if (child.settings.get("task") or {}).get("background"):
                await self.interrupt(child.id, f"parent {reason}")

    # --- permissions, questions, agents ---------------------------------------------------------

    async def respond(
        self,
        session_id: str,
        request_id: str,
        decision: Decision,
        message: str | None = None,
        *,
        answer: str | None = None,
        by: str | None = None,
        wait: float = 10.0,
    ) -> RespondResult:
        """Answer a waiting permission ask or question (``once``, ``always``, ``reject``).

        The update's id is the request id, so a repeat is answered once. When no worker answers
        in time (``wait`` seconds) the reply is sent as a durable signal, taken when a worker
        is back (``sent``).
        """
        validate_id(request_id, "request")
        await self._require_kind(session_id, request_id, answer is not None, decision)
        reply = PermissionReply(
            request_id=request_id, decision=decision, message=message, answer=answer, by=by
        )
        handle = self._handle(session_id)
        for _ in range(50):
            try:
                result = await handle.execute_update(
                    "respond",
                    reply,
                    id=request_id,
                    result_type=RespondResult,
                    rpc_timeout=timedelta(seconds=wait),
                )
                assert isinstance(result, RespondResult)
                return result
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                await self._waiting(session_id, request_id)
                await handle.signal("respond", reply)
                return RespondResult(status="sent", request_id=request_id)
            except (WorkflowUpdateFailedError, RPCError):
                # Recorded but not yet waiting (the workflow is a moment behind the store)?
                await self._waiting(session_id, request_id)
                await asyncio.sleep(0.1)
        raise TimeoutError(f"Request {request_id} was not taken: try again")

    async def answer(self, session_id: str, request_id: str, text: str) -> RespondResult:
        """Answer a question the model asked: ``text`` is the question tool's result."""
        return await self.respond(session_id, request_id, "once", answer=text)

    async def waiting(self, session_id: str) -> list[PermissionRequest]:
        """The permission asks and questions waiting for an answer, from the store."""
        return [
            part.state.asked
            for message in await self.messages(session_id)
            if isinstance(message, AssistantMessage)
            for part in message.content
            if isinstance(part, ToolPart)
            and isinstance(part.state, ToolRunning)
            and part.state.asked is not None
        ]

    async def _require_kind(
        self, session_id: str, request_id: str, answering: bool, decision: Decision
    ) -> None:
        """Refuse an answer to a permission ask, and an approval of a question without an
        answer (``WrongRequestKindError``, naming what waits and the command that answers
        it). A rejection of a question cancels it. A request not waiting is left to the
        update, which answers a repeat of the first reply with its result."""
        request = await self._find_waiting(session_id, request_id)
        if request is None:
            return
        if request.kind == "question" and (answering or decision == "reject"):
            return
        if request.kind == "permission" and not answering:
            return
        raise wrong_kind(session_id, request)

    async def _waiting(self, session_id: str, request_id: str) -> PermissionRequest:
        found = await self._find_waiting(session_id, request_id)
        if found is None:
            waiting = [r.request_id for r in await self.waiting(session_id)]
            raise RequestNotWaitingError(session_id, request_id, waiting)
        return found

    async def _find_waiting(self, session_id: str, request_id: str) -> PermissionRequest | None:
        return next((r for r in await self.waiting(session_id) if r.request_id == request_id), None)

    async def set_agent(self, session_id: str, agent: str) -> None:
        """Select the session's agent; it applies from the next model turn on."""
        self.agents.get(agent)  # an unknown name is an error here, at the edge
        await self.store.sessions.get(session_id)
        await self.store.events.publish(AgentSelected(session_id=session_id, agent=agent))

    async def status(self, session_id: str) -> SessionStatus:
        """What the session does now, and what it spent. Answers within a few seconds even
        when no worker runs: then ``waiting_for_worker`` says which task queue needs one."""
        info = await self.store.sessions.get(session_id)
        state = await self._activity(session_id)
        reached = info.budget.reached(info.spend) if info.budget is not None else None
        return replace(state, spend=info.spend, budget=info.budget, budget_reached=reached)

    async def _activity(self, session_id: str) -> SessionStatus:
        pending = len(await self.store.inputs.pending(session_id))
        queue = await self._queue(session_id, running_only=True)
        if queue is None:
            return SessionStatus(session_id, False, None, pending)
        if not await self._polled(queue):
            return SessionStatus(
                session_id, False, None, pending, str(NoWorkerError(queue, pending))
            )
        try:
            drain = await self._handle(session_id).query(
                "status", result_type=DrainStatus, rpc_timeout=ANSWER_TIMEOUT
            )
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return SessionStatus(session_id, False, None, pending)
            waiting = f"no worker on task queue {queue} answered within {ANSWER_TIMEOUT.seconds} s"
            return SessionStatus(session_id, False, None, pending, waiting)
        below = tuple([await self.status(child.session_id) for child in drain.children])
        return SessionStatus(session_id, drain.busy, drain, pending, subagents=below)

    async def workers(self, task_queue: str | None = None) -> int:
        """How many workers polled ``task_queue`` (default this client's) for workflow tasks
        in the last ``WORKER_SEEN_S`` seconds."""
        return len(await self._pollers(task_queue or self.task_queue))

    async def _pollers(self, task_queue: str) -> list[str]:
        """The identities of the workers that polled ``task_queue`` for workflow tasks in the
        last ``WORKER_SEEN_S`` seconds, less those of this host whose process has exited."""
        request = DescribeTaskQueueRequest(
            namespace=self.temporal.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        response = await self.temporal.workflow_service.describe_task_queue(
            request, timeout=ANSWER_TIMEOUT
        )
        seen_after = time.time() - WORKER_SEEN_S
        return [
            p.identity
            for p in response.pollers
            if p.last_access_time.seconds >= seen_after and not locate.gone(p.identity)
        ]

    async def _require_same_store(self) -> None:
        """Refuse when the workers polling this client's queue all say they write to another
        store (``StoreMismatchError``); no worker, or workers that do not say, pass."""
        try:
            identities = await self._pollers(self.task_queue)
        except (RPCError, RuntimeError):
            # An unanswered look (or a lazy client that cannot connect) is not a mismatch:
            # the session is the store's; the prompt says whether a worker runs.
            return
        keys = {locate.key_in_identity(identity) for identity in identities}
        ours = locate.store_key(self.store.db.url, self.store.db.schema)
        if not keys or None in keys or ours in keys:
            return
        address = self.temporal.service_client.config.target_host
        theirs = [locate.described(k, address, self.task_queue) for k in sorted(filter(None, keys))]
        mine = f"{locate.safe_url(self.store.db.url)} (store {ours})"
        raise StoreMismatchError(self.task_queue, mine, theirs)

    async def _polled(self, queue: str) -> bool:
        """Whether a worker polls ``queue``, looking again for a moment before saying no.

        A look the server did not answer in time (a busy server) is not a "no": it is asked
        again, a few times (``SLOW_ANSWER_TRIES``); any other failure is raised.
        """
        if time.monotonic() - self._unpolled.get(queue, -NO_WORKER_MEMORY_S) < NO_WORKER_MEMORY_S:
            return bool(await self.workers(queue))  # one look: it just said no
        deadline = time.monotonic() + NO_WORKER_GRACE_S
        slow = 0
        while True:
            try:
                if await self.workers(queue):
                    self._unpolled.pop(queue, None)
                    return True
            except RPCError as error:
                slow += 1
                if error.status not in _SLOW_ANSWERS or slow >= SLOW_ANSWER_TRIES:
                    raise
                continue  # not "no worker": the server was slow to say
            if time.monotonic() > deadline:
                self._unpolled[queue] = time.monotonic()
                return False
            await asyncio.sleep(0.2)

    async def waiting_for_worker(self, session_id: str) -> str | None:
        """Why the session's prompts wait for a worker (``NoWorkerError``'s text, with its
        pending inputs), or None when a worker polls the queue its drain runs on."""
        queue = await self._queue(session_id) or self.task_queue
        if await self._polled(queue):
            return None
        return str(NoWorkerError(queue, len(await self.store.inputs.pending(session_id))))

    async def _require_worker(self, session_id: str, queue: str) -> None:
        if not await self._polled(queue):
            raise NoWorkerError(queue, len(await self.store.inputs.pending(session_id)))

    async def _queue(self, session_id: str, *, running_only: bool = False) -> str | None:
        """The task queue of the session's open run; else this client's (None if
        ``running_only``)."""
        try:
            description = await self._handle(session_id).describe(rpc_timeout=ANSWER_TIMEOUT)
        except RPCError as error:
            if error.status != RPCStatusCode.NOT_FOUND:
                raise
        else:
            if description.status is not None and description.status.name == "RUNNING":
                return str(description.task_queue)
        return None if running_only else self.task_queue

    async def wait_idle(
        self,
        session_id: str,
        *,
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> SessionStatus:
        """Wait until the session is idle now (``SessionStatus.idle``) and return that status;
        never starts work. Work that waits for a worker is not idle: this keeps waiting for
        one. ``TimeoutError`` after ``timeout`` seconds says what it still waited for.

        Idle says nothing about how the last busy period ended (read its terminal event), and
        inputs may still be pending (``pending_inputs``): prompts admitted with ``wake=False``,
        or woken before an interrupt claimed their wakes; they run at the next prompt or resume.
        """
        deadline = time.monotonic() + timeout
        while True:
            status = await self.status(session_id)
            if status.idle:
                return status
            if time.monotonic() > deadline:
                why = status.waiting_for_worker or ("busy" if status.busy else "about to run")
                raise TimeoutError(f"Session {session_id} not idle after {timeout} s: {why}")
            await asyncio.sleep(0.05)

    # --- events ---------------------------------------------------------------------------------

    async def events(
        self, session_id: str, *, after: int = -1, follow: bool = False
    ) -> AsyncIterator[ClientEvent]:
        validate_id(session_id)
        async for item in self.store.events.log(session_id, after=after, follow=follow):
            if isinstance(item, StoredEvent):
                yield ClientEvent.of(item)

    def _handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(workflow_id(validate_id(session_id)))


def wrong_kind(session_id: str, request: PermissionRequest) -> WrongRequestKindError:
    """The error for a reply of the wrong kind to ``request``, naming what waits."""
    what = (
        repr(request.question)
        if request.kind == "question" and request.question
        else f"{request.tool}: {request.summary}"
    )
    return WrongRequestKindError(session_id, request.request_id, request.kind, what)


def _queued(queue: str, pending: int, *, polled: bool = False) -> str:
    """What an interrupt that no worker took means: it waits in the workflow for one."""
    waiting = "input waits" if pending == 1 else "inputs wait"
    why = (
        f"no worker on task queue {queue} answered in time"
        if polled
        else f"no worker is polling task queue {queue} ({pending} pending {waiting} for one)"
    )
    return (
        f"queued until a worker is back: {why}. When one polls, the interrupt comes first: it "
        f"stops the busy period, and prompts woken before it do not run (they stay pending "
        f"until the next prompt or resume)."
    )


def _summary(info: SessionInfo) -> str:
    """The drain's static summary in the Temporal UI: which session, model and workspace."""
    return f"session {info.id} · {info.model or 'no model'} · {info.directory}"


def _attributes(session_id: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(SESSION_ID_ATTRIBUTE, session_id)])


def _budget(budget: Budget | Mapping[str, float] | None) -> Budget | None:
    """A budget as given, checked at the edge; an empty one is none."""
    if budget is None:
        return None
    try:
        found = budget if isinstance(budget, Budget) else Budget.model_validate(dict(budget))
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise InvalidInputError(
            f"Invalid budget {dict(budget)!r}: {problems}. A budget is "
            '{"usd": <more than 0>, "tokens": <more than 0>}, either or both',
            field="budget",
        ) from None
    return None if found.empty else found


def _mcp_choices(choices: Mapping[str, bool] | None) -> dict[str, bool]:
    """``create_session``'s ``mcp``, checked: server names to booleans."""
    for name, on in (choices or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", name):
            raise ValueError(f"mcp: {name!r} is not an MCP server name")
        if not isinstance(on, bool):
            raise ValueError(f"mcp: {name!r} must be true or false, got {on!r}")
    return dict(choices or {})
