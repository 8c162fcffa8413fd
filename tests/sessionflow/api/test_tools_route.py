"""``GET /sessions/{id}/tools`` and ``sessionflow tools``: what a session's agent can call, with
each tool's origin, retry-safety and default permission, MCP servers' tools included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sessionflow.api.conftest import Api

ROOT = Path(__file__).parents[3]
SERVER = str(ROOT / "tests" / "activities" / "tools" / "mcp_server.py")


def configure(path: Path) -> Path:
    config = path / "mcp.json"
    servers = {
        "t": {"type": "local", "command": [sys.executable, SERVER, "stdio", str(path / "c")]},
        "bad": {"type": "local", "command": [str(path / "no-such-server")]},
    }
    config.write_text(json.dumps({"mcp": servers}))
    return config


async def listed(api: Api, settings: dict[str, Any], agent: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "workspace": str(api.h.workspace),
        "model": api.h.script([{"text": "x"}]),
        "settings": settings,
    }
    if agent:
        body["agent"] = agent
    created = await api.http.post("/sessions", json=body)
    assert created.status_code == 201, created.text
    answer = await api.http.get(f"/sessions/{created.json()['id']}/tools")
    assert answer.status_code == 200, answer.text
    return {tool["name"]: tool for tool in answer.json()}


async def test_a_sessions_tools_with_their_origins(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONFLOW_MCP", str(configure(tmp_path)))
    monkeypatch.setenv("SESSIONFLOW_TOOLS", "builtin")
    tools = await listed(api, {})
    assert tools["bash"] | {"description": ""} == {
        "name": "bash",
        "origin": "built-in",
        "retry_safe": False,
        "permission": "ask",
        "description": "",
    }
    assert tools["t_read_note"]["origin"] == "MCP server t"
    assert (tools["t_read_note"]["retry_safe"], tools["t_read_note"]["permission"]) == (
        True,
        "allow",
    )
    assert (tools["t_bump"]["retry_safe"], tools["t_bump"]["permission"]) == (False, "ask")
    # Turned off for a session, and what the plan agent's rules deny outright, are not listed.
    narrowed = await listed(api, {"mcp": {"t": False}}, agent="plan")
    assert not any(name.startswith("t_") for name in narrowed)
    assert "read" in narrowed and "write" not in narrowed and "apply_patch" not in narrowed


def test_the_cli_lists_the_configuration_without_a_store(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SESSIONFLOW_MCP": str(configure(tmp_path))}
    env["SESSIONFLOW_TOOLS"] = "builtin"
    done = subprocess.run(
        [sys.executable, "-m", "sessionflow.cli", "tools", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    names = [tool["name"] for tool in answer["tools"]]
    assert names[:3] == ["read", "write", "edit"] and "t_crash" in names
    (bad,) = answer["unavailable"]
    assert bad["server"] == "bad" and "could not start" in bad["error"]
