"""MCP server configuration, in opencode's shape, from the JSON file ``SESSIONFLOW_MCP`` names:

    {"mcp": {
      "git": {"type": "local", "command": ["python", "-m", "mcp_server_git",
              "--repository", "{workspace}"], "environment": {}, "timeout": 30000},
      "docs": {"type": "remote", "url": "http://127.0.0.1:9000/mcp", "headers": {}}}}

A local server speaks stdio, a remote one streamable HTTP. ``{workspace}`` in a command or an
environment value makes the server one per session workspace (started in it); otherwise there
is one per worker. ``timeout`` (ms) bounds each call and its start (at least 30 s).
``enabled: false`` leaves a server off unless a session turns it on
(``create_session(..., mcp={"docs": True})``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

WORKSPACE = "{workspace}"
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalServer(_Config):
    type: Literal["local"]
    command: tuple[str, ...] = Field(min_length=1)
    environment: dict[str, str] = Field(default_factory=dict)
    timeout: int = Field(default=30_000, gt=0)
    enabled: bool = True

    @property
    def per_workspace(self) -> bool:
        return any(WORKSPACE in part for part in (*self.command, *self.environment.values()))


class RemoteServer(_Config):
    type: Literal["remote"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = Field(default_factory=dict)
    timeout: int = Field(default=30_000, gt=0)
    enabled: bool = True

    @property
    def per_workspace(self) -> bool:
        return False


ServerConfig = Annotated[LocalServer | RemoteServer, Field(discriminator="type")]


class McpConfig(_Config):
    mcp: dict[str, ServerConfig] = Field(default_factory=dict)


class McpConfigError(ValueError):
    """An MCP configuration that cannot be used; the message names the file and the field."""


def load_config(path: str | Path) -> McpConfig:
    """The configuration in ``path``, checked: every server named as tools can be
    (``^[A-Za-z0-9_-]{1,32}$``: the tools are ``<server>_<tool>``), every field known."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise McpConfigError(f"SESSIONFLOW_MCP={path}: cannot read it: {error}") from None
    try:
        config = McpConfig.model_validate(json.loads(text))
    except json.JSONDecodeError as error:
        raise McpConfigError(f"SESSIONFLOW_MCP={path}: not JSON: {error}") from None
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise McpConfigError(f"SESSIONFLOW_MCP={path}: {where}: {first['msg']}") from None
    for name in config.mcp:
        if not _SERVER_NAME.fullmatch(name):
            raise McpConfigError(
                f"SESSIONFLOW_MCP={path}: server name {name!r} must match ^[A-Za-z0-9_-]{{1,32}}$"
            )
    return config
