"""MCP servers' tools through a drain: real Temporal, both databases, the scripted model.

``mcp-server-git`` (from PyPI, nobody here wrote it) against a git repository in the workspace,
and the test server of ``tests/activities/tools/mcp_server.py``, which counts the calls that
reach it: permissions from the tools' annotations, and a worker killed mid-call.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.tools.mcp import McpPool
from activities.tools.mcp_config import McpConfig
from activities.tools.settings import ToolSettings
from sessionflow.models.messages import ToolCompleted, ToolError
from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, call, harness
from tests.workflows.test_permissions import asked, tool_errors
from tests.workflows.workers import WorkerProcess

SERVER = str(Path(__file__).parents[1] / "activities" / "tools" / "mcp_server.py")


def servers(root: Path) -> dict[str, Any]:
    return {
        "mcp": {
            "git": {
                "type": "local",
                "command": [sys.executable, "-m", "mcp_server_git", "--repository", "{workspace}"],
            },
            "t": {"type": "local", "command": [sys.executable, SERVER, "stdio", str(root / "c")]},
        }
    }


@asynccontextmanager
async def mcp_harness(
    env: WorkflowEnvironment, store: Store, root: Path, **options: Any
) -> AsyncIterator[Harness]:
    pool = McpPool(McpConfig.model_validate(servers(root)), ToolSettings())
    try:
        async with harness(env.client, store, root, mcp=pool, **options) as h:
            yield h
    finally:
        await pool.close()


def calls(root: Path) -> list[str]:
    path = root / "c"
    return path.read_text().split() if path.exists() else []


def tool_states(messages: list[Any]) -> dict[str, Any]:
    return {
        part.call_id: part.state
        for m in messages
        if m.type == "assistant"
        for part in m.content
        if getattr(part, "type", "") == "tool"
    }


def out(state: Any) -> str:
    return "".join(getattr(part, "text", "") for part in state.content)


def _git(workspace: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=workspace,
        check=True,
        capture_output=True,
    )


async def test_mcp_server_git_answers_status_log_and_diff_in_a_drain(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with mcp_harness(temporal_env, store, tmp_path) as h:
        _git(h.workspace, "init", "-q")
        (h.workspace / "app.py").write_text("print('one')\n")
        _git(h.workspace, "add", "app.py")
        _git(h.workspace, "commit", "-q", "-m", "First commit")
        (h.workspace / "app.py").write_text("print('two')\n")
        repo = str(h.workspace)
        sid = await h.session(
            [
                call("s", "git_git_status", repo_path=repo),
                call("l", "git_git_log", repo_path=repo),
                call("d", "git_git_diff_unstaged", repo_path=repo),
            ],
            [{"text": "done"}],
            max_active_tools=2,  # the cap holds for MCP tools too: three calls, two at a time
        )
        await h.client.prompt(sid, "Look at the repository")
        await h.client.wait_idle(sid, timeout=60)
        states = tool_states(await h.messages(sid))
        first, second = h.requests()
    assert all(isinstance(state, ToolCompleted) for state in states.values()), states
    assert "modified:" in out(states["s"]) and "app.py" in out(states["s"])
    assert "First commit" in out(states["l"])
    assert "-print('one')" in out(states["d"]) and "+print('two')" in out(states["d"])
    offered = {tool["name"] for tool in first["tools"]}
    assert {"git_git_status", "git_git_commit", "t_read_note", "read", "bash"} <= offered
    assert len(second["messages"]) > len(first["messages"])


async def test_the_journal_records_what_mcp_tools_write_and_a_revert_puts_it_back(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    allow = [{"tool": "t_*", "action": "allow"}]
    async with mcp_harness(temporal_env, store, tmp_path) as h:
        ws = h.workspace
        (ws / "a.txt").write_text("a person's\n")
        sid = await h.session(
            [
                call("w", "t_write_file", path=str(ws / "a.txt"), content="the server's\n"),
                call("m", "t_make_linked", directory=str(ws), file_name="b.txt"),
            ],
            [{"text": "ok"}],
            permissions=allow,
            mcp={"git": False},
        )
        first = await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid, timeout=60)
        assert (ws / "a.txt").read_text() == "the server's\n" and (ws / "b.txt").exists()
        changed = {
            change["path"]: change
            for e in await h.events(sid)
            if e.type == "session.files.changed"
            for change in e.data["changes"]
        }
        assert changed["a.txt"]["before"]["stored"]  # named in its arguments: read first
        assert changed["b.txt"]["before"]["digest"] is None  # linked in its result: after it
        plan = await h.client.revert(sid, first.id)
        assert [(p.path, p.refused) for p in plan.refusals] == [("b.txt", "unknown-before")]
        plan = await h.client.revert(sid, first.id, force=["b.txt"])
        assert plan.applied, plan
        assert (ws / "a.txt").read_text() == "a person's\n" and (ws / "b.txt").exists()
    assert set(changed) == {"a.txt", "b.txt"}


async def test_an_unannotated_tool_asks_and_runs_once_approved(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with mcp_harness(temporal_env, store, tmp_path) as h:
        sid = await h.session(
            [call("b", "t_bump", by=3), call("r", "t_read_note", topic="x")], [{"text": "ok"}]
        )
        await h.client.prompt(sid, "Go")
        (request,) = await asked(h, sid)
        assert request.tool == "t_bump"
        # The read-only call runs while the other waits for its answer.
        await h.until(lambda: calls(tmp_path) == ["read_note"])
        await h.client.respond(sid, request.request_id, "once")
        await h.client.wait_idle(sid, timeout=30)
        states = tool_states(await h.messages(sid))
    assert isinstance(states["b"], ToolCompleted)
    assert sorted(calls(tmp_path)) == ["bump", "read_note"]


async def test_rules_match_mcp_tools_by_wildcard(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with mcp_harness(temporal_env, store, tmp_path) as h:
        sid = await h.session(
            [call("b", "t_bump"), call("p", "t_put", key="k"), call("n", "t_read_note", topic="n")],
            [{"text": "ok"}],
            permissions=[
                {"tool": "t_*", "action": "allow"},
                {"tool": "t_read_*", "action": "deny"},
            ],
        )
        await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid, timeout=30)
        messages = await h.messages(sid)
        states = tool_states(messages)
        offered = h.requests()[0]["tools"]
    assert isinstance(states["b"], ToolCompleted) and isinstance(states["p"], ToolCompleted)
    assert isinstance(states["n"], ToolError)
    # A tool whose every call is denied is not offered, and a call of it is refused.
    assert "t_read_note" not in {tool["name"] for tool in offered}
    assert tool_errors(messages) == ["Tool is not available for this request: t_read_note"]
    assert sorted(calls(tmp_path)) == ["bump", "put"]  # the denied call never reached it


async def test_a_session_can_turn_a_server_off(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with mcp_harness(temporal_env, store, tmp_path) as h:
        sid = await h.session(
            [call("n", "t_read_note", topic="n")], [{"text": "ok"}], mcp={"t": False}
        )
        await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid, timeout=30)
        states = tool_states(await h.messages(sid))
        (first, _second) = h.requests()
    assert not any(tool["name"].startswith("t_") for tool in first["tools"])
    assert isinstance(states["n"], ToolError) and states["n"].error.message == (
        "Unknown tool: t_read_note"
    )
    assert calls(tmp_path) == []


async def _killed_mid_call(
    env: WorkflowEnvironment,
    target: Target,
    store: Store,
    root: Path,
    workers: list[WorkerProcess],
    tool: str,
    counted: str,
) -> dict[str, Any]:
    config = root / "mcp.json"
    config.write_text(json.dumps(servers(root)))
    async with harness(env.client, store, root, start_worker=False) as h:
        sid = await h.session(
            [call("k", tool, seconds=3)],
            [{"text": "after"}],
            permissions=[{"tool": "t_*", "action": "allow"}],
        )
        first = WorkerProcess(env, target, h.client.task_queue, SESSIONFLOW_MCP=str(config))
        workers.append(first)
        await first.ready()
        await h.client.prompt(sid, "Go")
        await h.until(lambda: counted in calls(root), timeout=60)
        first.signal(signal.SIGKILL)
        second = WorkerProcess(env, target, h.client.task_queue, SESSIONFLOW_MCP=str(config))
        workers.append(second)
        await second.ready()
        await h.client.wait_idle(sid, timeout=90)
        return tool_states(await h.messages(sid))


async def test_a_read_only_call_runs_again_after_its_worker_dies(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    states = await _killed_mid_call(
        temporal_env, target, store, tmp_path, workers, "t_wait", "wait"
    )
    assert isinstance(states["k"], ToolCompleted) and out(states["k"]) == "waited 3.0"
    assert calls(tmp_path) == ["wait", "wait"]  # once per attempt, run again once


async def test_an_unannotated_call_is_never_called_twice_after_its_worker_dies(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    states = await _killed_mid_call(
        temporal_env, target, store, tmp_path, workers, "t_slow_bump", "slow_bump"
    )
    assert isinstance(states["k"], ToolError)
    assert states["k"].error.type == "tool.outcome-unknown"
    assert calls(tmp_path) == ["slow_bump"]
