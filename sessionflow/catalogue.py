"""What a session can call (``sessionflow tools``, ``GET /sessions/{id}/tools``): the tools a
worker configured like this process would offer (``SESSIONFLOW_TOOLS``, the entry points,
``SESSIONFLOW_MCP``), narrowed for a session to what its agent offers, its rules do not deny
outright and its MCP choices turn on. MCP servers are started to be asked for their tools, in
the session's workspace when their command names it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from activities.gate import session_rules
from activities.permissions import denies_everything
from activities.tools.base import ToolFailure, ToolRegistry
from sessionflow.agents import Agents
from store.sessions import SessionInfo


class ToolInfo(BaseModel):
    name: str
    origin: str  # built-in, plugin <entry>, entry point <name>, MCP server <name>, testing
    retry_safe: bool
    permission: Literal["allow", "ask", "deny"]  # for a call no rule matches
    description: str


class UnavailableServer(BaseModel):
    server: str
    error: str


async def session_tools(
    session: SessionInfo | None, agents: Agents
) -> tuple[list[ToolInfo], list[UnavailableServer]]:
    """The tools (and the MCP servers that could not be asked) for ``session``, or every
    configured tool without one."""
    from worker import mcp_from_env, tools_from_env

    registry, pool = tools_from_env(), mcp_from_env()
    unavailable: list[UnavailableServer] = []
    try:
        found: list[tuple[str, Any]] = []
        if pool is not None:
            names = pool.enabled(session.settings.get("mcp")) if session else list(pool.config.mcp)
            directory = session.directory if session else "."
            for name in names:
                try:
                    found += [(f"MCP server {name}", t) for t in await pool.tools(name, directory)]
                except ToolFailure as error:
                    unavailable.append(UnavailableServer(server=name, error=str(error)))
        merged = registry.merged(item for item in found if registry.get(item[1].name) is None)
    finally:
        if pool is not None:
            await pool.close()
    return _offered(merged, session, agents), unavailable


def _offered(tools: ToolRegistry, session: SessionInfo | None, agents: Agents) -> list[ToolInfo]:
    names = tools.names()
    if session is not None:
        agent = agents.get(session.agent)
        rules = session_rules(session, agent.permissions)
        names = [n for n in names if agent.offers(n) and not denies_everything(rules, n)]
    return [_info(tools, name) for name in names]


def _info(tools: ToolRegistry, name: str) -> ToolInfo:
    tool = tools.get(name)
    assert tool is not None
    return ToolInfo(
        name=name,
        origin=tools.origin(name) or "built-in",
        retry_safe=tool.retry_safe,
        permission=tool.permission,
        description=tool.description.strip().splitlines()[0] if tool.description else "",
    )
