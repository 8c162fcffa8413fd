"""``run_tool``: one local tool call, run at most once, settled through the fenced store.

Idempotent: a settled call returns its stored outcome. A retried attempt of a tool that is not
``retry_safe`` may follow a run whose effects happened but were never recorded, so it settles as
outcome-unknown instead of running twice; the model reads that and decides.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio import activity

from activities.runtime import Runtime, heartbeating, to_claim, translated
from activities.tools.base import ToolContext, ToolFailure, ToolOutput
from sessionflow import telemetry
from sessionflow.models import events as ev
from sessionflow.models.common import SessionError, TextContent
from sessionflow.models.drain import ToolInput, ToolOutcome
from sessionflow.models.messages import AssistantMessage, ToolCompleted, ToolError, ToolPart
from store.claims import Claim
from store.projector import load_message


class ToolActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self._workspaces: dict[str, Path] = {}

    @activity.defn
    async def run_tool(self, request: ToolInput) -> ToolOutcome:
        attributes = {"tool": request.name, "call.id": request.call_id}
        with telemetry.tracer().start_as_current_span("tool.run", attributes=attributes) as span:
            outcome = await self._run(request)
            span.set_attribute("outcome", outcome.status)
            return outcome

    async def _run(self, request: ToolInput) -> ToolOutcome:
        claim = to_claim(request.claim)
        async with translated(), heartbeating(self.rt.store, request.claim):
            part, workspace = await self._part(claim, request)
            if part is None:
                raise ValueError(f"Tool call {request.call_id} was never recorded as called")
            if isinstance(part.state, ToolCompleted | ToolError):
                return _outcome(part)
            tool = self.rt.tools.get(request.name)
            if tool is None:
                error = SessionError(type="tool.unknown", message=f"Unknown tool: {request.name}")
                return await self._settle(claim, request, error=error)
            if activity.info().attempt > 1 and not tool.retry_safe:
                error = SessionError(
                    type="tool.outcome-unknown",
                    message=(
                        f"The {request.name} call may or may not have run before its worker was "
                        f"lost, and it is not safe to run twice. Check its effects before calling "
                        f"it again."
                    ),
                )
                return await self._settle(claim, request, error=error)
            return await self._execute(claim, request, tool, part, workspace)

    async def _part(self, claim: Claim, request: ToolInput) -> tuple[ToolPart | None, Path]:
        store = self.rt.store
        workspace = self._workspaces.get(claim.session_id)
        if workspace is None:
            # A session's workspace never changes: read it once per worker.
            workspace = Path((await store.sessions.get(claim.session_id)).directory)
            if len(self._workspaces) >= 10_000:
                self._workspaces.clear()
            self._workspaces[claim.session_id] = workspace
        part = await store.sessions.tool_part(
            claim.session_id, request.assistant_message_id, request.call_id
        )
        return part, workspace

    async def _execute(
        self, claim: Claim, request: ToolInput, tool: Any, part: ToolPart, workspace: Path
    ) -> ToolOutcome:
        async def progress(structured: dict[str, Any], text: str) -> None:
            await self._publish(
                claim,
                ev.ToolProgress(
                    session_id=claim.session_id,
                    assistant_message_id=request.assistant_message_id,
                    call_id=request.call_id,
                    structured=structured,
                    content=(TextContent(text=text),) if text else (),
                ),
            )
            activity.heartbeat()

        context = ToolContext(
            session_id=claim.session_id,
            workspace=workspace,
            assistant_message_id=request.assistant_message_id,
            call_id=request.call_id,
            progress=progress,
        )
        try:
            tool_input = tool.input_model.model_validate(getattr(part.state, "input", {}))
            output: ToolOutput = await tool.execute(tool_input, context)
        except asyncio.CancelledError:
            raise
        except ValidationError as invalid:
            message = f"Invalid input for {request.name}: {invalid}"
            failure = SessionError(type="tool.execution", message=message)
            return await self._settle(claim, request, failure)
        except ToolFailure as refused:
            failure = SessionError(type="tool.execution", message=str(refused))
            return await self._settle(claim, request, failure)
        except Exception as defect:
            failure = SessionError(type="unknown", message=str(defect) or type(defect).__name__)
            return await self._settle(claim, request, failure)
        return await self._settle(claim, request, output=output)

    async def _settle(
        self,
        claim: Claim,
        request: ToolInput,
        error: SessionError | None = None,
        *,
        output: ToolOutput | None = None,
    ) -> ToolOutcome:
        event: ev.Event
        if error is not None:
            event = ev.ToolFailed(
                session_id=claim.session_id,
                assistant_message_id=request.assistant_message_id,
                call_id=request.call_id,
                error=error,
            )
        else:
            assert output is not None
            event = ev.ToolSucceeded(
                session_id=claim.session_id,
                assistant_message_id=request.assistant_message_id,
                call_id=request.call_id,
                structured=output.structured,
                content=output.content,
                output_paths=output.output_paths,
                output=output.full_text,
            )
        store = self.rt.store
        async with store.claims.fenced(claim) as tx:
            # Checked and settled in one fenced transaction: a call settles exactly once.
            message = await load_message(tx, claim.session_id, request.assistant_message_id)
            part = message.tool(request.call_id) if isinstance(message, AssistantMessage) else None
            if part is not None and part.settled:
                return _outcome(part)
            await store.events.publish(event, tx=tx)
        if error is not None:
            return ToolOutcome(call_id=request.call_id, status="error", error=error)
        return ToolOutcome(call_id=request.call_id, status="completed")

    async def _publish(self, claim: Claim, event: ev.Event) -> None:
        store = self.rt.store
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(event, tx=tx)


def _outcome(part: ToolPart) -> ToolOutcome:
    if isinstance(part.state, ToolError):
        return ToolOutcome(call_id=part.call_id, status="error", error=part.state.error)
    return ToolOutcome(call_id=part.call_id, status="completed")
