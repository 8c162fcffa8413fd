"""What a session waits for: permission asks and questions, their replies, and the agent."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from sessionflow.api.deps import Client, SessionId
from sessionflow.api.schemas import AgentChoice, Answer, Reply
from sessionflow.models.permissions import PermissionRequest, RespondResult

router = APIRouter(prefix="/sessions/{session_id}", tags=["permissions"])
RequestId = Annotated[str, Path(description="a waiting request's id, from GET .../waiting")]


@router.get("/waiting", response_model=list[PermissionRequest])
async def waiting(session_id: SessionId, client: Client) -> list[PermissionRequest]:
    """The permission asks and questions waiting for an answer."""
    return await client.waiting(session_id)


@router.post("/requests/{request_id}/reply", response_model=RespondResult)
async def reply(
    session_id: SessionId, request_id: RequestId, body: Reply, client: Client
) -> RespondResult:
    """Approve (``once``, ``always``) or deny (``reject``) a waiting call. ``answered``: the
    workflow took it; ``sent``: no worker answered in time, it applies when one runs. A request
    that is unknown or already answered is a 404."""
    return await client.respond(session_id, request_id, body.decision, body.message, by=body.by)


@router.post("/requests/{request_id}/answer", response_model=RespondResult)
async def answer(
    session_id: SessionId, request_id: RequestId, body: Answer, client: Client
) -> RespondResult:
    """Answer a question the model asked."""
    return await client.respond(session_id, request_id, "once", answer=body.text, by=body.by)


@router.post("/agent", status_code=204)
async def agent(session_id: SessionId, body: AgentChoice, client: Client) -> None:
    """Select the session's agent; it applies from the next model turn on."""
    await client.set_agent(session_id, body.agent)
