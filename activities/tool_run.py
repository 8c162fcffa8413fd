"""``run_tool``: one local tool call, run at most once, settled through the fenced store.

Idempotent: a settled call returns its stored outcome. Every write for the call carries its
activity attempt (``store/tool_runs.py``): an attempt takes the call just before the tool runs,
and a write from an older attempt, a zombie still running after its retry began, is refused.
A retried attempt of a tool that is not ``retry_safe`` whose call an earlier attempt took may
follow a run whose effects happened but were never recorded, so it settles as outcome-unknown
instead of running twice; the model reads that and decides. If no earlier attempt took the call
(it failed before the tool started, say on a database blip), the tool runs normally.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import context, journal
from activities.children import ChildCalls, child_summary, start_drain
from activities.gate import Gate
from activities.hosts import instructions
from activities.runtime import Runtime, heartbeating, own, through_outages, translated
from activities.tools.base import PermissionRejected, ToolContext, ToolFailure, ToolOutput
from activities.tools.settings import ToolSettings
from activities.tools.task import Task, prompt_input_id
from sessionflow import telemetry
from sessionflow.errors import ClaimLostError
from sessionflow.models import events as ev
from sessionflow.models.common import SessionError, TextContent
from sessionflow.models.drain import (
    LOCAL_HOST,
    ChildWait,
    ToolInput,
    ToolOutcome,
    UnreachableInput,
    WakeSignal,
)
from sessionflow.models.messages import ToolCompleted, ToolError, ToolPart
from store.claims import Claim
from store.sessions import SessionInfo, StoredPart
from store.tool_runs import Taken, ToolAttempt
from store.write.decide import Decision


class ToolActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    @activity.defn
    async def run_tool(self, request: ToolInput) -> ToolOutcome:
        attributes = {"tool": request.name, "call.id": request.call_id}
        with telemetry.tracer().start_as_current_span("tool.run", attributes=attributes) as span:
            outcome = await self._run(request)
            span.set_attribute("outcome", outcome.status)
            return outcome

    async def _run(self, request: ToolInput) -> ToolOutcome:
        claim = await own(self.rt.store, request.claim)
        run = ToolAttempt(
            claim.session_id,
            claim.execution_id,
            request.assistant_message_id,
            request.call_id,
            request.attempt_base + activity.info().attempt,
            claim.owner_id,
        )
        async with translated(), heartbeating(self.rt.store, request.claim):
            session, stored = await through_outages(
                lambda: self.rt.store.sessions.tool_call(
                    claim.session_id, request.assistant_message_id, request.call_id
                ),
                within_ms=claim.lease_ms,
            )
            if stored is None:
                raise ValueError(f"Tool call {request.call_id} was never recorded as called")
            part = stored.part
            if isinstance(part.state, ToolCompleted | ToolError):
                await _start_in_background(part, claim.session_id, request.assistant_message_id)
                return _outcome(part)
            if request.child is None and not self.rt.runs_tools_of(session):
                raise not_this_host(self.rt.host, session.host)
            try:
                tool = await self.rt.tool_for(session, request.name)
            except ToolFailure as unavailable:  # an MCP server that cannot start
                error = SessionError(type="tool.execution", message=str(unavailable))
                return await self._settle(claim, run, error=error, before=stored)
            if tool is None:
                error = SessionError(type="tool.unknown", message=f"Unknown tool: {request.name}")
                return await self._settle(claim, run, error=error, before=stored)
            if isinstance(tool, Task) and (request.child is not None or request.refused):
                children = ChildCalls(self, session, claim, run)
                if request.child is not None:
                    return await children.collect(part, request.child)
                return await children.start(tool, part, request.refused)
            gate = self.gate(session, claim, run, tool, part)
            stopped = await (gate.check() if request.reply is None else gate.replied(request.reply))
            if stopped is not None:
                return stopped
            if isinstance(tool, Task):
                # Never taken: every step of a start is idempotent, and the call's collect is
                # a new activity whose attempts count from 1 again (a start at attempt 2 that
                # took the call would fence out the collect that settles it).
                return await ChildCalls(self, session, claim, run).start(tool, part, None)
            if await self._take_call(claim, run, tool):
                return await self._settle(claim, run, error=_outcome_unknown(request.name))
            answer = request.reply.answer if request.reply is not None else None
            return await self._execute(claim, run, tool, stored, session, answer)

    def gate(
        self, session: SessionInfo, claim: Claim, run: ToolAttempt, tool: Any, part: ToolPart
    ) -> Gate:
        return Gate(self, session, claim, run, tool, part)

    async def _take_call(self, claim: Claim, run: ToolAttempt, tool: Any) -> bool:
        """Take the call for this attempt; whether an earlier attempt of a tool that is not
        ``retry_safe`` may have run it.

        Attempt 1 of a retry-safe tool takes nothing, sparing a write: there is no older
        attempt to fence out, and a later one takes the call over all the same.
        """
        if run.attempt == 1 and tool.retry_safe:
            return False

        async def take() -> Taken:
            # Idempotent: taken again by the same attempt, the call reports the same earlier one.
            # The same attempt of another run (a reset run re-issued it) is not this attempt.
            return await self.rt.store.claims.run_fenced(
                claim, lambda tx: self.rt.store.tool_runs.take_run(tx, run)
            )

        taken = await through_outages(take, within_ms=claim.lease_ms)
        return taken.may_have_run(run.attempt) and not tool.retry_safe

    async def _execute(
        self,
        claim: Claim,
        run: ToolAttempt,
        tool: Any,
        stored: StoredPart,
        session: SessionInfo,
        answer: str | None,
    ) -> ToolOutcome:
        part = stored.part

        async def progress(structured: dict[str, Any], text: str) -> None:
            await self._publish(
                claim,
                run,
                ev.ToolProgress(
                    session_id=claim.session_id,
                    assistant_message_id=run.assistant_message_id,
                    call_id=run.call_id,
                    structured=structured,
                    content=(TextContent(text=text),) if text else (),
                    host=self.rt.host,
                ),
            )
            activity.heartbeat()

        context = ToolContext(
            session_id=claim.session_id,
            workspace=Path(session.directory),
            assistant_message_id=run.assistant_message_id,
            call_id=run.call_id,
            progress=progress,
            network=bool(session.settings.get("network", False)),
            answer=answer,
            todos=lambda: self._todos(claim.session_id),
        )
        try:
            tool_input = tool.input_model.model_validate(getattr(part.state, "input", {}))
            before = await self._before(session, tool, tool_input)
            output: ToolOutput = await tool.execute(tool_input, context)
            output = await self._journaled(session, run, tool, before, output)
        except (asyncio.CancelledError, ClaimLostError):
            raise  # stopped, or fenced out (a later attempt took the call): settle nothing
        except ValidationError as invalid:
            message = f"Invalid input for {tool.name}: {invalid}"
            failure = SessionError(type="tool.execution", message=message)
            return await self._settle(claim, run, failure, before=stored)
        except PermissionRejected as rejected:
            failure = SessionError(type="permission.rejected", message=str(rejected))
            return await self._settle(claim, run, failure, before=stored)
        except ToolFailure as refused:
            failure = SessionError(type="tool.execution", message=str(refused))
            return await self._settle(claim, run, failure, before=stored)
        except Exception as defect:
            failure = SessionError(type="unknown", message=str(defect) or type(defect).__name__)
            return await self._settle(claim, run, failure, before=stored)
        observed = self._observed(session, tool)
        return await self._settle(claim, run, output=output, before=stored, observed=observed)

    async def _before(
        self, session: SessionInfo, tool: Any, tool_input: Any
    ) -> dict[str, journal.Seen] | None:
        """What the paths the call names hold before it runs; None for a tool that changes
        nothing (the journal then reads nothing after it either)."""
        if not tool.may_change_files():
            return None
        settings = _settings_of(tool, self.rt)
        paths = tool.touches(tool_input)
        if not paths:
            return {}
        return await asyncio.to_thread(journal.capture, session.directory, settings, paths)

    async def _journaled(
        self,
        session: SessionInfo,
        run: ToolAttempt,
        tool: Any,
        before: dict[str, journal.Seen] | None,
        output: ToolOutput,
    ) -> ToolOutput:
        """``output`` with its ``session.files.changed`` entry (the journal), its contents kept
        first (a blob no settlement names costs only space)."""
        if before is None or not (before or output.output_paths):
            return output
        settings = _settings_of(tool, self.rt)
        found, kept = await asyncio.to_thread(
            journal.changes, session.directory, settings, before, output
        )
        if not found:
            return output
        await through_outages(
            lambda: self.rt.store.blobs.put_many(kept), within_ms=self.rt.store.claims.lease_ms
        )
        entry = ev.FilesChanged(
            session_id=run.session_id,
            assistant_message_id=run.assistant_message_id,
            call_id=run.call_id,
            changes=tuple(found),
        )
        return replace(output, events=(*output.events, entry))

    def _observed(self, session: SessionInfo, tool: Any) -> ev.WorkspaceObserved | None:
        """On a named host, the workspace's instruction files when a call that may write
        changed them: turns run on other hosts' workers, which read them from the store."""
        if self.rt.host == LOCAL_HOST or tool.retry_safe:
            return None
        now = instructions(session.directory, self.rt.tools)
        if now == session.settings.get("observed"):
            return None
        return ev.WorkspaceObserved(session_id=session.id, instructions=now)

    @activity.defn
    async def host_unreachable(self, request: UnreachableInput) -> ToolOutcome:
        """Settle a call whose host has no live worker, from the shared queue: outcome-unknown
        if one of the host's workers took it (it may have run), else the host error. The
        attempt is above every attempt the host made, so a late write from there is refused."""
        tool = request.tool
        claim = await own(self.rt.store, tool.claim)
        run = ToolAttempt(
            claim.session_id,
            claim.execution_id,
            tool.assistant_message_id,
            tool.call_id,
            request.attempt,
            claim.owner_id,
        )
        async with translated():

            async def take() -> int | None:
                return await self.rt.store.claims.run_fenced(
                    claim, lambda tx: self.rt.store.tool_runs.take(tx, run)
                )

            earlier = await through_outages(take, within_ms=claim.lease_ms)
            error = _host_gone(request.host, tool.name, ran=earlier is not None)
            return await self._settle(claim, run, error=error)

    async def _settle(
        self,
        claim: Claim,
        run: ToolAttempt,
        error: SessionError | None = None,
        *,
        output: ToolOutput | None = None,
        before: StoredPart | None = None,
        observed: ev.WorkspaceObserved | None = None,
        held: bool = False,
    ) -> ToolOutcome:
        """Settle the call once, by its latest attempt: a retry after a commit cut off finds
        it settled and answers what settled it. From ``before`` (the part as read when the call
        began) the store writes it at once where it can, else it decides again from the part
        as its fenced transaction reads it (a part that moved: progress, an answer, another
        settlement). ``held``: the call held the claim while it waited (for its child): the
        same write puts the claim back on its lease once no call of the step waits."""
        event = _settlement(run, error, output).model_copy(update={"host": self.rt.host})
        outcome = _settled_outcome(run, error)

        written = [event, *(output.events if output is not None else ())]
        if observed is not None:
            written.append(observed)
        todos = [e.todos for e in written if isinstance(e, ev.TodoUpdated)]
        if todos:
            outcome = outcome.model_copy(update={"todos": todos[-1]})

        lease_after = run.assistant_message_id if held else None

        def decide(part: ToolPart | None) -> Decision[ToolOutcome]:
            if part is not None and part.settled:
                return Decision(_outcome(part), lease_after=lease_after)
            return Decision(outcome, written, lease_after=lease_after)

        async def settle() -> ToolOutcome:
            return await self.rt.store.settle_with(claim, run, before, decide)

        # The tool ran: its outcome is only here until it is stored, so a database outage is
        # waited out (within the lease) rather than failing the call. Each try is safe to
        # repeat: a settlement that committed is found settled by the next one.
        return await through_outages(settle, within_ms=claim.lease_ms)

    async def _todos(self, session_id: str) -> tuple[ev.Todo, ...]:
        latest = await self.rt.store.events.latest_of(session_id, ev.TodoUpdated)
        if latest is None or not isinstance(latest.data, ev.TodoUpdated):
            return ()
        return latest.data.todos

    async def _publish(self, claim: Claim, run: ToolAttempt, event: ev.Event) -> None:
        store = self.rt.store
        await store.claims.run_fenced(claim, lambda tx: store.events.publish(event, tx=tx), run=run)


def _settings_of(tool: Any, rt: Runtime) -> ToolSettings:
    """The confinement ``tool`` applies (a built-in's own), else the read tool's."""
    settings = getattr(tool, "settings", None)
    return settings if isinstance(settings, ToolSettings) else context.tool_settings(rt.tools)


def _settlement(
    run: ToolAttempt, error: SessionError | None, output: ToolOutput | None
) -> ev.ToolSucceeded | ev.ToolFailed:
    if error is not None:
        return ev.ToolFailed(
            session_id=run.session_id,
            assistant_message_id=run.assistant_message_id,
            call_id=run.call_id,
            error=error,
        )
    assert output is not None
    return ev.ToolSucceeded(
        session_id=run.session_id,
        assistant_message_id=run.assistant_message_id,
        call_id=run.call_id,
        structured=output.structured,
        content=output.content,
        output_paths=output.output_paths,
        output=output.full_text,
    )


def _settled_outcome(run: ToolAttempt, error: SessionError | None) -> ToolOutcome:
    if error is not None:
        return ToolOutcome(call_id=run.call_id, status="error", error=error)
    return ToolOutcome(call_id=run.call_id, status="completed")


def not_this_host(ours: str | None, theirs: str) -> ApplicationError:
    """A call that reached a worker of another host (or one that runs no tools): nothing ran;
    Temporal hands the attempt to another worker of the queue."""
    worker = f"host {ours}" if ours else "no host (it runs turns only)"
    return ApplicationError(
        f"this worker serves {worker}, and the session's tools run on host {theirs}: "
        "the call did not run here",
        type="WrongHost",
    )


def _host_gone(host: str, name: str, *, ran: bool) -> SessionError:
    if ran:
        return SessionError(
            type="tool.outcome-unknown",
            message=(
                f"host `{host}` stopped while the {name} call ran, and no worker of it came "
                f"back within its lease: the call may or may not have run. Check its effects "
                f"before calling it again."
            ),
        )
    return SessionError(
        type="tool.host-unavailable",
        message=f"host `{host}` is not running; the tool did not run",
    )


def _outcome_unknown(name: str) -> SessionError:
    return SessionError(
        type="tool.outcome-unknown",
        message=(
            f"The {name} call may or may not have run before its worker was lost, and it is "
            f"not safe to run twice. Check its effects before calling it again."
        ),
    )


def _outcome(part: ToolPart) -> ToolOutcome:
    if isinstance(part.state, ToolError):
        return ToolOutcome(call_id=part.call_id, status="error", error=part.state.error)
    return ToolOutcome(call_id=part.call_id, status="completed")


async def _start_in_background(part: ToolPart, session_id: str, message_id: str) -> None:
    """A background ``task`` call settled at its start: start its child's drain again, in
    case the attempt that settled it died before it did (a wake is idempotent)."""
    structured = part.state.structured if isinstance(part.state, ToolCompleted) else {}
    if part.name != Task.name or not structured.get("background"):
        return
    child_id = structured["task_id"]
    wait = ChildWait(session_id=child_id, agent=structured.get("agent", ""), parent_id=session_id)
    prompt_id = prompt_input_id(child_id, message_id, part.call_id)
    await start_drain(child_id, WakeSignal(input_id=prompt_id), child_summary(wait))
