"""Sessions: create, list, read, and the projected transcript."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from sessionflow.api.deps import Client, SessionId
from sessionflow.api.schemas import (
    CreateSession,
    ForkSession,
    MoveSession,
    RevertSession,
    UnrevertSession,
)
from sessionflow.catalogue import ToolInfo
from sessionflow.client import Job, Usage
from sessionflow.models.journal import RevertPlan
from sessionflow.models.messages import Message
from sessionflow.models.spend import Budget
from store.sessions import SessionInfo

router = APIRouter(prefix="/sessions", tags=["sessions"])


@router.post("", status_code=201, response_model=SessionInfo)
async def create_session(body: CreateSession, client: Client, response: Response) -> SessionInfo:
    created = await client.create_session(
        workspace=body.workspace,
        model=body.model,
        title=body.title,
        session_id=body.session_id,
        max_active_tools=body.settings.max_active_tools,
        max_steps=body.settings.max_steps,
        system=body.settings.system,
        compaction=body.settings.compaction,
        agent=body.agent,
        permissions=body.settings.permissions,
        network=body.settings.network,
        approval_timeout=body.settings.approval_timeout,
        mcp=body.settings.mcp,
        host=body.host,
        budget=body.budget,
    )
    response.headers["Location"] = f"/sessions/{created}"
    return await client.session(created)


@router.get("", response_model=list[SessionInfo])
async def list_sessions(
    client: Client,
    directory: str | None = None,
    search: str | None = None,
    roots: Annotated[bool, Query(description="only top-level sessions")] = False,
    updated_since: Annotated[int | None, Query(description="epoch ms", ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[SessionInfo]:
    """Sessions, most recently updated first."""
    return await client.list_sessions(
        directory=directory,
        search=search,
        roots_only=roots,
        updated_since=updated_since,
        limit=limit,
    )


@router.get("/{session_id}", response_model=SessionInfo)
async def get_session(session_id: SessionId, client: Client) -> SessionInfo:
    return await client.session(session_id)


@router.post("/{session_id}/move", response_model=SessionInfo)
async def move_session(session_id: SessionId, body: MoveSession, client: Client) -> SessionInfo:
    """Move the session's tools to another host, between busy periods only (409 while busy);
    the new host checks the workspace first (503 when it has no live worker)."""
    return await client.move(session_id, body.host, workspace=body.workspace)


@router.post("/{session_id}/revert", response_model=RevertPlan)
async def revert(
    session_id: SessionId, body: RevertSession, client: Client, response: Response
) -> RevertPlan:
    """Put the workspace and the conversation back to ``message_id``, between busy periods:
    the plan path by path, ``applied`` once done. 409 when refused (busy, a path changed
    since: ``force`` it), changing nothing."""
    plan = await client.revert(session_id, body.message_id, dry_run=body.dry_run, force=body.force)
    return _answered(plan, response)


@router.post("/{session_id}/unrevert", response_model=RevertPlan)
async def unrevert(
    session_id: SessionId, body: UnrevertSession, client: Client, response: Response
) -> RevertPlan:
    """Undo the last revert while no prompt came after it; 409 when refused."""
    return _answered(await client.unrevert(session_id, force=body.force), response)


@router.post("/{session_id}/fork", response_model=RevertPlan)
async def fork(
    session_id: SessionId, body: ForkSession, client: Client, response: Response
) -> RevertPlan:
    """A new session (``fork_session_id``) with the history up to ``message_id`` and a copy
    of the workspace as it was then, in ``workspace``; between busy periods. 409 when
    refused (busy, the directory exists, a path's content then is unknown: ``force`` it)."""
    plan = await client.fork(
        session_id,
        body.message_id,
        workspace=body.workspace,
        dry_run=body.dry_run,
        force=body.force,
    )
    return _answered(plan, response)


def _answered(plan: RevertPlan, response: Response) -> RevertPlan:
    """A rewind's plan, 409 when it was refused (it changed nothing)."""
    if plan.refused is not None or plan.refusals:
        response.status_code = 409
    return plan


@router.put("/{session_id}/budget", response_model=SessionInfo)
async def set_budget(session_id: SessionId, body: Budget, client: Client) -> SessionInfo:
    """Replace its spending limits (an empty body: none). A session its budget stopped
    continues with ``POST /sessions/{id}/resume`` once they are above what it spent."""
    return await client.set_budget(session_id, body.model_dump(exclude_none=True))


@router.get("/{session_id}/tools", response_model=list[ToolInfo])
async def tools(session_id: SessionId, client: Client) -> list[ToolInfo]:
    """What the session's agent can call, as a worker configured like this server offers it:
    name, origin (built-in, plugin, MCP server), retry-safe, default permission."""
    return await client.tools(session_id)


@router.get("/{session_id}/messages", response_model=list[Message])
async def messages(
    session_id: SessionId,
    client: Client,
    hidden: Annotated[bool, Query(description="also the messages a revert hides")] = False,
) -> list[Message]:
    """The transcript as the store projects it: user, assistant (parts), synthetic messages."""
    return await client.messages(session_id, hidden=hidden)


@router.get("/{session_id}/children", response_model=list[SessionInfo])
async def children(session_id: SessionId, client: Client) -> list[SessionInfo]:
    """The child sessions its ``task`` calls started (subagents), oldest first; each one's
    ``settings.task`` names the call that started it."""
    return await client.children(session_id)


@router.get("/{session_id}/jobs", response_model=list[Job])
async def jobs(session_id: SessionId, client: Client) -> list[Job]:
    """Its background tasks: each child session, whether it runs now, how it last ended."""
    return await client.jobs(session_id)


@router.get("/{session_id}/usage", response_model=Usage)
async def usage(session_id: SessionId, client: Client) -> Usage:
    """Tokens and cost: the session's own, each subagent's (theirs inside), the tree's total."""
    return await client.usage(session_id)
