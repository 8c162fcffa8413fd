"""MCP servers' tools through the worker's pool: real servers written with the SDK's own
``MCPServer`` (``mcp_server.py``), over stdio and streamable HTTP, and the server's own count
of the calls that reached it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import types as t

from activities.tools.base import ToolContext, ToolFailure
from activities.tools.mcp import McpPool, McpServerError, McpTool, workspace_paths
from activities.tools.mcp_config import McpConfig, McpConfigError, load_config
from activities.tools.output import TRUNCATION_MARKER
from activities.tools.settings import ToolSettings
from sessionflow.locate import process_alive
from sessionflow.models.common import TextContent

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def local(calls: Path, **options: Any) -> dict[str, Any]:
    return {"type": "local", "command": [sys.executable, SERVER, "stdio", str(calls)], **options}


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[McpPool]:
    config = McpConfig.model_validate({"mcp": {"t": local(tmp_path / "calls.txt")}})
    running = McpPool(config, ToolSettings())
    yield running
    await running.close()


def context(workspace: Path) -> ToolContext:
    async def progress(_data: dict[str, Any], _title: str) -> None:
        return None

    return ToolContext("ses_t", workspace, "msg_t", "call_t", progress)


async def call(tools: dict[str, McpTool], name: str, workspace: Path, **arguments: Any) -> Any:
    tool = tools[name]
    return await tool.execute(tool.input_model.model_validate(arguments), context(workspace))


async def tools_of(pool: McpPool, workspace: Path, server: str = "t") -> dict[str, McpTool]:
    return {tool.name: tool for tool in await pool.tools(server, str(workspace))}


def calls(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def text(output: Any) -> str:
    return "".join(p.text for p in output.content if isinstance(p, TextContent))


async def test_annotations_decide_retry_safety_and_the_default_permission(
    pool: McpPool, tmp_path: Path
) -> None:
    tools = await tools_of(pool, tmp_path)
    assert {name: (tool.retry_safe, tool.permission) for name, tool in tools.items()} == {
        "t_write_file": (True, "ask"),
        "t_make_linked": (False, "ask"),
        "t_read_note": (True, "allow"),
        "t_wait": (True, "allow"),
        "t_big": (True, "allow"),
        "t_refuse": (True, "allow"),
        "t_put": (True, "ask"),  # idempotent: safe to run again, still asked
        "t_bump": (False, "ask"),
        "t_slow_bump": (False, "ask"),
        "t_crash": (False, "ask"),
    }
    # What may write the workspace is journaled: all but the read-only.
    assert [n for n, tool in tools.items() if not tool.may_change_files()] == [
        "t_read_note",
        "t_wait",
        "t_big",
        "t_refuse",
    ]
    spec = tools["t_read_note"].spec()
    assert spec.description == "Read a note (read-only)."
    assert spec.input_schema["properties"] == {"topic": {"title": "Topic", "type": "string"}}


async def test_a_call_returns_text_and_structured_content(pool: McpPool, tmp_path: Path) -> None:
    tools = await tools_of(pool, tmp_path)
    note = await call(tools, "t_read_note", tmp_path, topic="tests")
    assert text(note) == "note about tests"
    bumped = await call(tools, "t_bump", tmp_path, by=2)
    assert bumped.structured["structured_content"] == {"bumped": 2}
    assert calls(tmp_path / "calls.txt") == ["read_note", "bump"]


async def test_a_tool_error_is_the_calls_failure_and_the_server_lives_on(
    pool: McpPool, tmp_path: Path
) -> None:
    tools = await tools_of(pool, tmp_path)
    with pytest.raises(ToolFailure) as failed:
        await call(tools, "t_refuse", tmp_path)
    assert not isinstance(failed.value, McpServerError)
    assert "refuse" in str(failed.value)
    assert text(await call(tools, "t_read_note", tmp_path, topic="after")) == "note about after"


async def test_a_crash_mid_call_names_the_server_its_exit_and_stderr_then_restarts(
    pool: McpPool, tmp_path: Path
) -> None:
    tools = await tools_of(pool, tmp_path)
    with pytest.raises(McpServerError) as crashed:
        await call(tools, "t_crash", tmp_path)
    message = str(crashed.value)
    assert message.startswith("MCP server t failed during the call (command ")
    assert "exited with status 3" in message
    assert "stderr: about to crash: disk on fire" in message
    # The next call starts the server again; the call it died in is not repeated.
    assert text(await call(tools, "t_read_note", tmp_path, topic="x")) == "note about x"
    assert calls(tmp_path / "calls.txt") == ["crash", "read_note"]


async def test_a_hang_is_bounded_by_the_timeout_and_the_server_restarts(tmp_path: Path) -> None:
    config = McpConfig.model_validate({"mcp": {"t": local(tmp_path / "calls.txt", timeout=1500)}})
    pool = McpPool(config, ToolSettings())
    try:
        tools = await tools_of(pool, tmp_path)
        with pytest.raises(McpServerError) as hung:
            await call(tools, "t_wait", tmp_path, seconds=600)
        assert str(hung.value) == (
            "MCP server t did not answer wait within 1.5 s; "
            "it was stopped and starts again for the next call"
        )
        assert text(await call(tools, "t_read_note", tmp_path, topic="y")) == "note about y"
    finally:
        await pool.close()


async def test_a_server_that_cannot_start_says_which_command_and_why(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-server")
    config = McpConfig.model_validate({"mcp": {"gone": {"type": "local", "command": [missing]}}})
    pool = McpPool(config, ToolSettings())
    with pytest.raises(McpServerError) as failed:
        await pool.tools("gone", str(tmp_path))
    message = str(failed.value)
    assert message == (
        f"MCP server gone could not start (command {missing}): "
        f"[Errno 2] No such file or directory: '{missing}'"
    )
    await pool.close()


async def test_a_20_mb_result_is_capped_like_a_built_ins(pool: McpPool, tmp_path: Path) -> None:
    settings = ToolSettings()
    tools = await tools_of(pool, tmp_path)
    output = await call(tools, "t_big", tmp_path, megabytes=20)
    body = text(output)
    cut = 20 * 1024 * 1024 - settings.output_cap
    assert body == "x" * settings.output_cap + TRUNCATION_MARKER.format(cut)
    assert output.structured["truncated_bytes"] == cut
    assert output.full_text is not None and len(output.full_text) < settings.store_cap + 100
    # The structured copy of the same 20 MB does not reach the store either.
    assert "structured_content" not in output.structured


async def test_a_workspace_server_runs_once_per_workspace_in_it(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    command = [sys.executable, SERVER, "stdio", "{workspace}/calls.txt"]
    config = McpConfig.model_validate({"mcp": {"w": {"type": "local", "command": command}}})
    pool = McpPool(config, ToolSettings())
    try:
        for workspace in (one, two, one):
            tools = await tools_of(pool, workspace, "w")
            await call(tools, "w_read_note", workspace, topic=workspace.name)
        assert calls(one / "calls.txt") == ["read_note", "read_note"]
        assert calls(two / "calls.txt") == ["read_note"]
    finally:
        await pool.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, SERVER, "http", str(port), str(tmp_path / "calls.txt")],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        for _ in range(300):
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None:
                    raise AssertionError("the HTTP MCP server exited") from None
                time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait(10)


async def test_a_remote_server_over_streamable_http(http_server: str, tmp_path: Path) -> None:
    config = McpConfig.model_validate(
        {"mcp": {"docs": {"type": "remote", "url": http_server, "headers": {"X-Team": "a"}}}}
    )
    pool = McpPool(config, ToolSettings())
    try:
        tools = await tools_of(pool, tmp_path, "docs")
        assert tools["docs_bump"].retry_safe is False
        assert text(await call(tools, "docs_read_note", tmp_path, topic="h")) == "note about h"
        output = await call(tools, "docs_big", tmp_path, megabytes=20)
        assert output.structured["truncated_bytes"] == 20 * 1024 * 1024 - 50_000
        assert calls(tmp_path / "calls.txt") == ["read_note", "big"]
    finally:
        await pool.close()


async def test_a_remote_server_that_is_not_there_fails_its_start(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    config = McpConfig.model_validate(
        {"mcp": {"docs": {"type": "remote", "url": url, "timeout": 5000}}}
    )
    pool = McpPool(config, ToolSettings())
    with pytest.raises(McpServerError) as failed:
        await asyncio.wait_for(pool.tools("docs", str(tmp_path)), 30)
    assert str(failed.value).startswith(f"MCP server docs could not start ({url})")
    await pool.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"mcp": {"git": {"type": "local"}}}', "mcp.git.local.command: Field required"),
        ('{"mcp": {"git": {"type": "ftp"}}}', "mcp.git: Input tag 'ftp'"),
        ('{"mcp": {"g it": {"type": "remote", "url": "http://x"}}}', "server name 'g it'"),
        ('{"mcp": {"d": {"type": "remote", "url": "x"}}}', "mcp.d.remote.url: String should"),
        ('{"mcp": {"d": {"type": "remote", "url": "http://x", "cmd": 1}}}', "cmd: Extra inputs"),
    ],
)
def test_a_bad_configuration_names_the_file_and_the_field(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(content)
    with pytest.raises(McpConfigError) as bad:
        load_config(path)
    assert str(bad.value).startswith(f"SESSIONFLOW_MCP={path}: ")
    assert message in str(bad.value)


def test_a_missing_configuration_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match="cannot read it"):
        load_config(tmp_path / "absent.json")
    (tmp_path / "ok.json").write_text(json.dumps({"mcp": {"t": local(tmp_path / "c")}}))
    assert load_config(tmp_path / "ok.json").mcp["t"].per_workspace is False


def _servers_of(root: Path) -> list[int]:
    """Pids of processes whose command line names ``root`` (the servers of a test)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(root).encode() in cmdline and b"mcp_server.py" in cmdline:
                found.append(int(entry.name))
    return found


async def _until_gone(root: Path) -> None:
    for _ in range(600):
        if not _servers_of(root):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"MCP server processes left: {_servers_of(root)}")


async def test_a_hung_server_does_not_outlive_its_pool(tmp_path: Path) -> None:
    config = McpConfig.model_validate({"mcp": {"t": local(tmp_path / "calls.txt")}})
    pool = McpPool(config, ToolSettings())
    tools = await tools_of(pool, tmp_path)
    hung = asyncio.create_task(call(tools, "t_wait", tmp_path, seconds=600))
    for _ in range(600):  # the call reached the server, which ignores its closed stdin
        if "wait" in calls(tmp_path / "calls.txt"):
            break
        await asyncio.sleep(0.05)
    await pool.close()
    assert _servers_of(tmp_path) == []
    with pytest.raises(McpServerError):
        await hung


async def test_a_server_that_died_while_idle_is_restarted_before_the_call(
    pool: McpPool, tmp_path: Path
) -> None:
    tools = await tools_of(pool, tmp_path)
    await call(tools, "t_read_note", tmp_path, topic="a")
    killed = _servers_of(tmp_path)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    # Dead as the pool judges it: a killed process loses its command line before the
    # kernel marks it a zombie, so "gone from the listing" can come first.
    for _ in range(600):
        if not any(process_alive(pid) for pid in killed):
            break
        await asyncio.sleep(0.05)
    # Not "failed during the call": nothing reached the dead server, so nothing is uncertain.
    assert text(await call(tools, "t_bump", tmp_path)) == '{\n  "bumped": 1\n}'
    assert calls(tmp_path / "calls.txt") == ["read_note", "bump"]


async def test_the_server_dies_with_its_worker_even_mid_call(tmp_path: Path) -> None:
    holder = tmp_path / "holder.py"
    holder.write_text(
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from activities.tools.mcp import McpPool\n"
        "from activities.tools.mcp_config import McpConfig\n"
        "from activities.tools.settings import ToolSettings\n"
        f"CONFIG = {json.dumps({'mcp': {'t': local(tmp_path / 'calls.txt')}})!r}\n"
        "async def main():\n"
        "    pool = McpPool(McpConfig.model_validate_json(CONFIG), ToolSettings())\n"
        "    (tool,) = [t for t in await pool.tools('t', '.') if t.name == 't_wait']\n"
        "    print('ready', flush=True)\n"
        "    await pool.connection('t', '.')\n"
        "    connection = await pool.connection('t', '.')\n"
        "    await connection.call('wait', {'seconds': 600})\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    worker = subprocess.Popen([sys.executable, str(holder)], stdout=subprocess.PIPE, env=env)
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == b"ready"
        for _ in range(600):  # the call reached the server
            if calls(tmp_path / "calls.txt") == ["wait"]:
                break
            await asyncio.sleep(0.05)
        worker.kill()
        worker.wait(10)
        await _until_gone(tmp_path)
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_results_file_links_inside_the_workspace_are_the_paths_it_reports(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    inside = (ws / "a b.txt").as_uri()  # percent-encoded
    result = t.CallToolResult(
        content=[
            t.ResourceLink(name="a", uri=inside),
            t.ResourceLink(name="o", uri=(tmp_path / "outside.txt").as_uri()),
            t.ResourceLink(name="h", uri="https://example.com/x.txt"),
            t.EmbeddedResource(
                type="resource",
                resource=t.TextResourceContents(uri=(ws / "d" / "e.txt").as_uri(), text="e"),
            ),
            t.ResourceLink(name="again", uri=inside),
        ]
    )
    assert workspace_paths(result, str(ws)) == ("a b.txt", "d/e.txt")
