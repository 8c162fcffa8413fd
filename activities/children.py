"""A ``task`` call's child session, inside ``run_tool``: started, then collected.

``start`` checks the call (the subagent exists and is one, no recursion, the depth bound),
creates the child session (its id comes from the call, so a retried attempt finds the child
the first one made), admits the prompt (its id comes from the call too), records the link on
the call (``session.tool.progress`` naming the child) in a fenced transaction that also holds
the parent's claim, and starts the child's drain (signal-with-start ``wake``, idempotent). The
parent's workflow then waits for it holding nothing (``workflows/children.py``), as a
permission ask waits. A background call is settled at once with the child's id instead.

``collect`` settles the call once the child's busy period that took the call's prompt ended,
as the store says (``answered``): its final answer, or its error; the answer of the last
waiting call hands the claim back to its ordinary lease. The ``child_finished`` signal only
says when to look, so either side may restart, and a lost parent step closes its task calls
from the store too (``closing_of_task``).

``report`` is the child's side, run by ``finish_execution`` with the child's terminal: the
signal, or, when no call can wait for it, the result as a message of the parent (once per
child), which wakes it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from activities.gate import HOLD_MS
from activities.runtime import through_outages
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
    InterruptRequest,
    ParentCall,
    ReportInput,
    ToolOutcome,
    WakeSignal,
    workflow_id,
)
from sessionflow.models.messages import AssistantMessage, TextPart, ToolError, ToolPart
from store.claims import Claim
from store.db import Tx
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
        found = await self._child(task, agent)
        if isinstance(found, str):
            return await self.fail(found)
        child, created = found
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
        if not wait.background and not created:
            # An earlier run of the parent started the child, which has answered since
            # (its signal found nobody waiting): settle now, never wait for a signal gone.
            done = await answered(self.store, child.id, prompt_id)
            if done is not None:
                return await self._collect(wait, done)
        drain = start_drain(child.id, WakeSignal(input_id=prompt_id), child_summary(wait))
        try:
            if wait.background:
                # Settled before the child starts: its report then finds the call answered
                # with the child's id, and admits the result as a message.
                await self._link(wait)
                await drain
            else:  # a waiting call is found by its child's report, linked or not yet
                await asyncio.gather(self._link(wait), drain)
        except asyncio.CancelledError:
            # The parent was interrupted while the child's drain started (or not): it must
            # not run on unseen by the parent, which never learns its id.
            await asyncio.shield(_interrupt_child(child.id, "parent interrupted"))
            raise
        if wait.background:  # settled with the child's id by ``_link``
            return ToolOutcome(call_id=self.run.call_id, status="completed", child=wait)
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

    async def _child(self, task: TaskInput, agent: Agent) -> tuple[SessionInfo, bool] | str:
        """The call's child session, created unless an earlier attempt did, and whether this
        attempt created it; a message when ``task_id`` names a session that is not a child of
        this one."""
        sessions = self.store.sessions
        if task.task_id is not None:
            try:
                child = await sessions.get(task.task_id)
            except (SessionNotFoundError, ValueError):
                child = None
            if child is None or child.parent_id != self.session.id:
                return f"No task {task.task_id!r} of this session to continue"
            return child, False
        sid = child_session_id(self.session.id, self.run.assistant_message_id, self.run.call_id)
        settings = {k: self.session.settings[k] for k in INHERITED if k in self.session.settings}
        settings["task"] = {
            "assistant_message_id": self.run.assistant_message_id,
            "call_id": self.run.call_id,
            "background": task.background,
            "depth": depth_of(self.session) + 1,
            "description": task.description,
        }
        try:
            created = await sessions.create(
                self.session.directory,
                session_id=sid,
                title=f"{task.description} (@{agent.name} subagent)",
                model=agent.model or self.session.model,
                agent=agent.name,
                workspace_id=self.session.workspace_id,
                parent_id=self.session.id,
                settings=settings,
                host=self.session.host,  # the same workspace, on the same host
                observed=self.session.settings.get("observed"),
            )
        except InvalidDurableEventError:  # an earlier or a concurrent attempt created it
            return await sessions.get(sid), False
        return created, True

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
        """Settle the call with what its child answered, as the store says; a signal for
        another prompt of the child (or a timeout the child beat) is read against it."""
        child_id = finished.child_session_id
        linked = (getattr(part.state, "structured", None) or {}).get("child")
        wait = ChildWait.model_validate(linked) if linked else None
        prompt_id = prompt_input_id(child_id, self.run.assistant_message_id, self.run.call_id)
        done = await answered(self.store, child_id, prompt_id)
        if done is None and not finished.timed_out and wait is not None:
            receipt = await self.store.inputs.get(prompt_id)
            if finished.outcome == "interrupted" and receipt and receipt.promoted_seq is None:
                # Interrupted before it took this call's prompt: the interrupt fails the call
                # (its prompt stays pending in the child, as an interrupt leaves prompts).
                finished = finished.model_copy(
                    update={"error": f"{finished.error} (before it took this task)"}
                )
                return await self._collect(wait, finished)
            return ToolOutcome(call_id=self.run.call_id, status="child", child=wait)
        if done is None or (finished.timed_out and done.outcome == "interrupted"):
            done = finished  # the timeout's own interrupt: say it timed out
        wait = wait or ChildWait(session_id=child_id, agent="", parent_id=self.session.id)
        return await self._collect(wait, done)

    async def _collect(self, wait: ChildWait, finished: ChildFinished) -> ToolOutcome:
        return await self._settle(*await result_of(self.store, wait, finished))

    async def _settle(self, error: SessionError | None, output: Any) -> ToolOutcome:
        """The settlement, with the ordinary lease back once no call of the step waits."""
        return await self.tools._settle(self.claim, self.run, error, output=output, held=True)


TERMINALS = (ev.ExecutionSucceeded, ev.ExecutionFailed, ev.ExecutionInterrupted)
# The reason a recovery ends a dead execution with (``activities/session.py``).
SUPERSEDED = "superseded"


async def result_of(
    store: Any, wait: ChildWait, finished: ChildFinished, tx: Tx | None = None
) -> tuple[SessionError | None, ToolOutput | None]:
    """The call's settlement from its child's end: the child's final answer, or its error."""
    child_id = finished.child_session_id
    who = f"The {wait.agent} subagent (task_id {child_id})".replace("The  ", "The ")
    if finished.timed_out:
        message = f"{who} did not finish within {wait.timeout_s or 0:g} s and was interrupted"
        return SessionError(type="tool.execution", message=message), None
    if finished.outcome == "succeeded":
        answer = await final_answer(store, child_id, finished.seq, tx=tx)
        structured = {"task_id": child_id, "agent": wait.agent, "outcome": "succeeded"}
        return None, _text_output(answer_text(child_id, answer), structured)
    how = "was interrupted" if finished.outcome == "interrupted" else "failed"
    message = f"{who} {how}: {finished.error or finished.outcome}"
    return SessionError(type="tool.execution", message=message), None


async def closing_of_task(
    store: Any, message: AssistantMessage, part: ToolPart, tx: Tx
) -> ev.Event | None:
    """How a lost step closes its ``task`` call that waits on a child (None for any other
    call): with the child's result when the child has answered, else failed saying that the
    child runs on, whose result then arrives as a message (``report`` finds the
    call closed). Never a plain stale error: the model would start the work again."""
    linked = (getattr(part.state, "structured", None) or {}).get("child")
    if part.name != Task.name or not linked:
        return None
    wait = ChildWait.model_validate(linked)
    ids: dict[str, Any] = {
        "session_id": message.session_id,
        "assistant_message_id": message.id,
        "call_id": part.call_id,
    }
    prompt_id = prompt_input_id(wait.session_id, message.id, part.call_id)
    done = await answered(store, wait.session_id, prompt_id, tx=tx)
    if done is None:
        text = (
            f"Tool execution interrupted: task. Its {wait.agent} subagent (task_id "
            f"{wait.session_id}) runs on: its result arrives as a message when it finishes; "
            "do not start it again"
        )
        stale = SessionError(type="tool.stale", message=text)
        return ev.ToolFailed(**ids, error=stale, executed=True)
    error, output = await result_of(store, wait, done, tx)
    if error is not None:
        return ev.ToolFailed(**ids, error=error, executed=True)
    assert output is not None
    return ev.ToolSucceeded(
        **ids, structured=output.structured, content=output.content, executed=True
    )


async def answered(
    store: Any, child_id: str, prompt_id: str, tx: Tx | None = None
) -> ChildFinished | None:
    """How the child's busy period that took the call's prompt ended, from the store (None
    while the prompt waits or that busy period runs). The store, not the ``child_finished``
    signal, says whether a call was answered: a signal may come before its parent's run
    waits, or after, or for an earlier prompt of the same child."""
    receipt = await store.inputs.get(prompt_id, tx=tx)
    if receipt is None or receipt.promoted_seq is None:
        return None
    after = receipt.promoted_seq
    while True:
        end = await store.events.first_of(child_id, TERMINALS, after=after, tx=tx)
        if end is None:
            return None
        superseded = isinstance(end.data, ev.ExecutionInterrupted) and end.data.reason == SUPERSEDED
        if not superseded:
            break
        after = end.seq  # a dead execution's end: the one that took over goes on with the prompt
    data = end.data
    error = data.error.message[:1000] if isinstance(data, ev.ExecutionFailed) else None
    if isinstance(data, ev.ExecutionInterrupted):
        error = data.reason
    outcome = data.type.rsplit(".", 1)[-1]
    return ChildFinished(child_session_id=child_id, outcome=outcome, error=error, seq=end.seq)


async def final_answer(
    store: Any, session_id: str, before: int | None = None, tx: Tx | None = None
) -> str:
    """The text of the session's last assistant message (before seq ``before`` when given;
    "" without one)."""
    for message in reversed(await store.sessions.messages(session_id, tx=tx)):
        if isinstance(message, AssistantMessage) and (before is None or message.seq < before):
            return "".join(p.text for p in message.content if isinstance(p, TextPart))
    return ""


def _text_output(text: str, structured: dict[str, Any]) -> ToolOutput:
    return ToolOutput.text(text, **structured)


async def start_drain(session_id: str, wake: WakeSignal, summary: str) -> None:
    """Start (or wake) a session's drain from an activity, as the client does: signal-with-
    start ``wake``, on the task queue this activity runs on."""
    await activity.client().start_workflow(
        "SessionWorkflow",
        DrainInput(session_id=session_id),
        id=workflow_id(session_id),
        task_queue=activity.info().task_queue,
        start_signal="wake",
        start_signal_args=[wake],
        search_attributes=TypedSearchAttributes([SearchAttributePair(_SESSION_ID, session_id)]),
        static_summary=summary[:200],
    )


async def _interrupt_child(child_id: str, reason: str) -> None:
    try:
        handle = activity.client().get_workflow_handle(workflow_id(child_id))
        await handle.signal("interrupt", InterruptRequest(reason=reason))
    except RPCError as gone:  # its drain never started: nothing runs
        activity.logger.info("Child %s not interrupted: %s", child_id, gone)


def child_summary(wait: ChildWait) -> str:
    """What the Temporal UI says of a child's drain: its agent, its parent, its task."""
    return f"{wait.agent} subagent of {wait.parent_id}: {wait.description}"


async def report(store: Any, request: ReportInput) -> None:
    """A child's busy period ended (its terminal is written): tell the parent. Its drain, if
    one runs, gets a ``child_finished`` signal, a hint (a call that waits settles from the
    store); a call of the parent this busy period answered that nobody waits for (a
    background task, or a call its parent's recovery closed while the child ran on) gets the
    answer as a message of the parent (once per call, as the store says), which wakes it,
    idle or not. A child its parent interrupted says nothing back: the parent stopped on
    purpose."""
    parent_id, child_id = request.parent.session_id, request.child_session_id
    finished = ChildFinished(
        child_session_id=child_id, outcome=request.outcome, error=request.error
    )
    # Sent at once, before the parent's calls are read: a hint costs a call that does not
    # wait nothing (it settles from the store), and the one that waits is told sooner.
    told = asyncio.create_task(_tell(parent_id, finished))
    try:
        admitted = await _unanswered(store, parent_id, child_id)
    finally:
        await told
    for input_id in admitted:
        await start_drain(parent_id, WakeSignal(input_id=input_id), f"session {parent_id}")


async def _unanswered(store: Any, parent_id: str, child_id: str) -> list[str]:
    """Admit, as messages of the parent, the answers of its calls that nobody waits for; the
    ids of the inputs admitted (now or by an earlier report)."""
    admitted: list[str] = []
    for message_id, part in await _calls_of(store, parent_id, child_id):
        if not part.settled:
            continue  # it waits: its settlement reads the store, whatever this end was
        prompt_id = prompt_input_id(child_id, message_id, part.call_id)
        done = await answered(store, child_id, prompt_id)
        if done is None:
            continue
        if not _nobody_waits(part) or (done.error or "").startswith("parent "):
            continue
        input_id = background_result_id(child_id, message_id, part.call_id)
        if await store.inputs.get(input_id) is None:
            text = await _result_message(store, child_id, done)
            await store.inputs.admit(
                parent_id, Prompt(text=text), input_id=input_id, delivery="queue"
            )
        admitted.append(input_id)
    return admitted


async def _tell(parent_id: str, finished: ChildFinished) -> None:
    """The ``child_finished`` signal to the parent's drain, if one runs."""
    try:
        handle = activity.client().get_workflow_handle(workflow_id(parent_id))
        await handle.signal("child_finished", finished)
    except RPCError as gone:  # no drain runs: the parent's recovery reads the store
        activity.logger.info("Parent %s not signalled: %s", parent_id, gone)


async def _calls_of(store: Any, parent_id: str, child_id: str) -> list[tuple[str, ToolPart]]:
    """The parent's ``task`` calls linked to ``child_id`` (the one that started it and any
    follow-up), with their message ids."""
    found = []
    for message in await store.sessions.messages(parent_id):
        if not isinstance(message, AssistantMessage):
            continue
        for part in message.content:
            if isinstance(part, ToolPart) and part.name == Task.name:
                structured = getattr(part.state, "structured", None) or {}
                linked = (structured.get("child") or {}).get("session_id")
                if child_id in (linked, structured.get("task_id")) or (
                    not linked and child_session_id(parent_id, message.id, part.call_id) == child_id
                ):
                    found.append((message.id, part))
    return found


def _nobody_waits(part: ToolPart) -> bool:
    """A settled call whose result did not carry the child's answer: started in the
    background, or closed by a recovery while the child ran on."""
    state = part.state
    if isinstance(state, ToolError):
        return state.error.type == "tool.stale"
    return bool((getattr(state, "structured", None) or {}).get("background"))


async def _result_message(store: Any, child_id: str, done: ChildFinished) -> str:
    child = await store.sessions.get(child_id)
    description = (child.settings.get("task") or {}).get("description") or "no description"
    head = f"The task {child_id} ({description})"
    if done.outcome == "succeeded":
        answer = await final_answer(store, child_id, done.seq)
        return f"{head} finished.\n\n{answer_text(child_id, answer)}"
    return f"{head} did not finish ({done.outcome}): {done.error or done.outcome}"
