"""A ``task`` call's child session, inside ``run_tool``: started, then collected.

``start`` checks the call (the subagent exists and is one, no recursion, the depth bound),
creates the child session (its id comes from the call, so a retried attempt finds the child
the first one made), admits the prompt (its id comes from the call too) and records the link
on the call (``session.tool.progress`` naming the child) in one fenced transaction that also
holds the parent's claim: the parent's workflow then starts the child's workflow and waits
for it holding nothing (``workflows/children.py``), as a permission ask waits. A background
call is settled at once with the child's id instead.

``collect`` settles the call once the child's busy period ended: its final answer, or its
error; the answer of the last waiting call hands the claim back to its ordinary lease. Results
travel through the store (the child's messages) and a signal (``child_finished``, which only
says that and how it ended), so either side may restart.

``ChildActivities.report_to_parent`` is the background child's side: its result becomes a
message of the parent (once per child) and wakes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from activities.gate import HOLD_MS, still_waiting
from activities.runtime import Runtime, through_outages, translated
from activities.tools.base import ToolOutput
from activities.tools.task import (
    Task,
    TaskInput,
    answer_text,
    background_result_id,
    child_session_id,
    prompt_input_id,
)
from sessionflow.agents import Agent, UnknownAgentError
from sessionflow.errors import InvalidDurableEventError, SessionNotFoundError
from sessionflow.models import events as ev
from sessionflow.models.common import Prompt, SessionError, TextContent
from sessionflow.models.drain import (
    SESSION_ID_SEARCH_ATTRIBUTE,
    ChildFinished,
    ChildWait,
    DrainInput,
    ParentCall,
    ReportInput,
    ToolOutcome,
    WakeSignal,
    workflow_id,
)
from sessionflow.models.messages import AssistantMessage, TextPart, ToolPart
from store.claims import Claim
from store.sessions import SessionInfo
from store.tool_runs import ToolAttempt

if TYPE_CHECKING:
    from activities.tool_run import ToolActivities

# Settings a child takes from its parent: what bounds it (rules, network, limits, servers).
INHERITED = (
    "permissions",
    "network",
    "approval_timeout",
    "max_active_tools",
    "mcp",
    "compaction",
)
_SESSION_ID = SearchAttributeKey.for_keyword(SESSION_ID_SEARCH_ATTRIBUTE)


def depth_of(session: SessionInfo) -> int:
    """0 for a root session; a child is one deeper than its parent."""
    return int((session.settings.get("task") or {}).get("depth", 0))


def parent_call(session: SessionInfo) -> ParentCall | None:
    """The ``task`` call a child session answers (None for a root session)."""
    task = session.settings.get("task")
    if not task or not session.parent_id:
        return None
    return ParentCall(
        session_id=session.parent_id,
        assistant_message_id=task["assistant_message_id"],
        call_id=task["call_id"],
        background=bool(task.get("background")),
    )


class ChildCalls:
    """The ``task`` tool's two halves, for ``run_tool``."""

    def __init__(self, tools: ToolActivities, session: SessionInfo, claim: Claim, run: ToolAttempt):
        self.tools, self.session, self.claim, self.run = tools, session, claim, run
        self.store = tools.rt.store

    async def fail(self, message: str) -> ToolOutcome:
        error = SessionError(type="tool.execution", message=message)
        return await self.tools._settle(self.claim, self.run, error)

    async def start(self, tool: Task, part: ToolPart, refused: str | None) -> ToolOutcome:
        if refused is not None:
            return await self.fail(refused)
        try:
            task = TaskInput.model_validate(getattr(part.state, "input", {}))
        except ValidationError as invalid:
            return await self.fail(f"Invalid input for task: {invalid}")
        agent, problem = self._subagent(tool, task)
        if problem is not None:
            return await self.fail(problem)
        assert agent is not None
        child = await self._child(task, agent)
        if isinstance(child, str):
            return await self.fail(child)
        wait = ChildWait(
            session_id=child.id,
            agent=agent.name,
            description=task.description,
            timeout_s=task.timeout_s,
            background=task.background,
            parent_id=self.session.id,
        )
        prompt_id = prompt_input_id(child.id, self.run.assistant_message_id, self.run.call_id)
        await through_outages(
            lambda: self.store.inputs.admit(child.id, task.prompt, input_id=prompt_id),
            within_ms=self.claim.lease_ms,
        )
        await self._link(wait)
        return ToolOutcome(call_id=self.run.call_id, status="child", child=wait)

    def _subagent(self, tool: Task, task: TaskInput) -> tuple[Agent | None, str | None]:
        names = ", ".join(a.name for a in tool.agents.subagents())
        try:
            agent = tool.agents.get(task.subagent_type)
        except UnknownAgentError:
            return None, f"Unknown subagent {task.subagent_type!r}: the subagents are {names}"
        if not agent.subagent:
            return None, (
                f"The {agent.name} agent is not a subagent (its mode is {agent.mode}): use one "
                f"of {names}"
            )
        caller = self.session.agent or tool.agents.default
        if agent.name == caller and depth_of(self.session) > 0:
            return None, (
                f"A {caller} subagent cannot start another {caller} subagent (recursion): do "
                "the work here, or use another subagent"
            )
        depth = depth_of(self.session) + 1
        if depth > tool.max_depth:
            return None, (
                f"This task would run at depth {depth}, beyond the depth bound "
                f"(SESSIONFLOW_MAX_DEPTH = {tool.max_depth}): do the work here instead"
            )
        return agent, None

    async def _child(self, task: TaskInput, agent: Agent) -> SessionInfo | str:
        """The call's child session, created unless an earlier attempt did; a message when
        ``task_id`` names a session that is not a child of this one."""
        sessions = self.store.sessions
        if task.task_id is not None:
            try:
                child = await sessions.get(task.task_id)
            except (SessionNotFoundError, ValueError):
                child = None
            if child is None or child.parent_id != self.session.id:
                return f"No task {task.task_id!r} of this session to continue"
            return child
        sid = child_session_id(self.session.id, self.run.assistant_message_id, self.run.call_id)
        try:
            return await sessions.get(sid)
        except SessionNotFoundError:
            pass
        settings = {k: self.session.settings[k] for k in INHERITED if k in self.session.settings}
        settings["task"] = {
            "assistant_message_id": self.run.assistant_message_id,
            "call_id": self.run.call_id,
            "background": task.background,
            "depth": depth_of(self.session) + 1,
            "description": task.description,
        }
        try:
            return await sessions.create(
                self.session.directory,
                session_id=sid,
                title=f"{task.description} (@{agent.name} subagent)",
                model=agent.model or self.session.model,
                agent=agent.name,
                workspace_id=self.session.workspace_id,
                parent_id=self.session.id,
                settings=settings,
            )
        except InvalidDurableEventError:  # a concurrent attempt created it first
            return await sessions.get(sid)

    async def _link(self, wait: ChildWait) -> None:
        """Name the child on the call; a foreground call holds the claim while it waits (no
        renewal runs meanwhile), a background one is settled with the child's id."""
        if wait.background:
            text = (
                f"Started in the background: task_id {wait.session_id}. Its result arrives "
                "as a message when it finishes."
            )
            structured = {"task_id": wait.session_id, "agent": wait.agent, "background": True}
            await self.tools._settle(self.claim, self.run, output=_text_output(text, structured))
            return
        progress = ev.ToolProgress(
            session_id=self.claim.session_id,
            assistant_message_id=self.run.assistant_message_id,
            call_id=self.run.call_id,
            structured={"child": wait.model_dump(mode="json")},
            content=(TextContent(text=f"Running the {wait.agent} subagent: {wait.session_id}"),),
        )
        hold = int(wait.timeout_s * 1000) + self.claim.lease_ms if wait.timeout_s else HOLD_MS

        async def link(tx: Any) -> None:
            await self.store.events.publish(progress, tx=tx)
            await self.store.claims.hold_for(tx, self.claim, hold)

        await through_outages(
            lambda: self.store.claims.run_fenced(self.claim, link, run=self.run),
            within_ms=self.claim.lease_ms,
        )

    async def collect(self, part: ToolPart, finished: ChildFinished) -> ToolOutcome:
        """Settle the call with what its child answered."""
        child_id = finished.child_session_id
        linked = (getattr(part.state, "structured", None) or {}).get("child") or {}
        agent = linked.get("agent", "")
        who = f"The {agent} subagent (task_id {child_id})".replace("The  ", "The ")
        error: SessionError | None = None
        output = None
        if finished.timed_out:
            timeout = float(linked.get("timeout_s") or 0)
            message = f"{who} did not finish within {timeout:g} s and was interrupted"
            error = SessionError(type="tool.execution", message=message)
        elif finished.outcome == "succeeded":
            answer = await final_answer(self.store, child_id)
            structured = {"task_id": child_id, "agent": agent, "outcome": "succeeded"}
            output = _text_output(answer_text(child_id, answer), structured)
        else:
            how = "was interrupted" if finished.outcome == "interrupted" else "failed"
            message = f"{who} {how}: {finished.error or finished.outcome}"
            error = SessionError(type="tool.execution", message=message)
        return await self._settle(error, output)

    async def _settle(self, error: SessionError | None, output: Any) -> ToolOutcome:
        """The settlement, and the ordinary lease back once no call of the step waits."""
        outcome = await self.tools._settle(self.claim, self.run, error, output=output)

        async def lease(tx: Any) -> None:
            if not await still_waiting(tx, self.claim.session_id, self.run.assistant_message_id):
                await self.store.claims.lease_again(tx, self.claim)

        await through_outages(
            lambda: self.store.claims.run_fenced(self.claim, lease, run=self.run),
            within_ms=self.claim.lease_ms,
        )
        return outcome


async def final_answer(store: Any, session_id: str) -> str:
    """The text of the session's last assistant message ("" without one)."""
    for message in reversed(await store.sessions.messages(session_id)):
        if isinstance(message, AssistantMessage):
            return "".join(p.text for p in message.content if isinstance(p, TextPart))
    return ""


def _text_output(text: str, structured: dict[str, Any]) -> ToolOutput:
    return ToolOutput.text(text, **structured)


class ChildActivities:
    """The child's side of a background ``task``."""

    def __init__(self, runtime: Runtime, *, task_queue: str) -> None:
        self.rt = runtime
        self.task_queue = task_queue

    @activity.defn
    async def report_to_parent(self, request: ReportInput) -> None:
        """Admit the child's result to its parent as a message (once per child) and wake
        the parent, idle or not."""
        parent, child_id = request.parent, request.child_session_id
        input_id = background_result_id(child_id)
        async with translated():
            if await self.rt.store.inputs.get(input_id) is None:
                text = await self._result(request)
                await self.rt.store.inputs.admit(
                    parent.session_id, Prompt(text=text), input_id=input_id, delivery="queue"
                )
        await activity.client().start_workflow(
            "SessionWorkflow",
            DrainInput(session_id=parent.session_id),
            id=workflow_id(parent.session_id),
            task_queue=self.task_queue,
            start_signal="wake",
            start_signal_args=[WakeSignal(input_id=input_id)],
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(_SESSION_ID, parent.session_id)]
            ),
            static_summary=f"session {parent.session_id}",
        )

    async def _result(self, request: ReportInput) -> str:
        child_id = request.child_session_id
        head = f"The background task {child_id} ({request.description or 'no description'})"
        if request.outcome == "succeeded":
            answer = await final_answer(self.rt.store, child_id)
            return f"{head} finished.\n\n{answer_text(child_id, answer)}"
        why = request.error or request.outcome
        return f"{head} did not finish ({request.outcome}): {why}"
