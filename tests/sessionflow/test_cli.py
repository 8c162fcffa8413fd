"""The CLI driven as a user would: subprocesses against a real dev server and SQLite store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import Target
from tests.workflows.harness import Harness, harness

ROOT = Path(__file__).parents[2]


class Cli:
    def __init__(self, address: str, database: str, task_queue: str) -> None:
        self.base = [
            sys.executable,
            "-m",
            "sessionflow.cli",
            "--temporal",
            address,
            "--database",
            database,
            "--task-queue",
            task_queue,
        ]

    async def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [*self.base, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )

    async def json(self, *args: str) -> Any:
        done = await self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    async def watch(self, session: str, *extra: str) -> list[dict[str, Any]]:
        done = await self.run("watch", session, "--json", "--until-idle", *extra)
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
async def cli(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Cli, Harness]]:
    target = Target(f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}")
    store = await target.open()
    async with harness(temporal_env.client, store, tmp_path) as h:
        address = temporal_env.client.service_client.config.target_host
        yield Cli(address, target.url, h.client.task_queue), h
    await store.close()


async def test_new_prompt_watch_show_and_sessions(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    model = h.script([{"text": "Hello from the model", "chunks": 4}])
    created = await run.json("new", "--workspace", str(h.workspace), "--model", model)
    sid = created["session_id"]
    receipt = await run.json("prompt", sid, "Say hello")
    assert receipt["delivery"] == "steer"
    events = await run.watch(sid)
    types = [e["type"] for e in events]
    assert types[0] == "session.created" and types[-1] == "session.execution.succeeded"
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert "".join(e["data"]["delta"] for e in events if e["type"] == "session.text.delta") == (
        "Hello from the model"
    )
    transcript = await run.json("show", sid)
    assert [m["type"] for m in transcript] == ["user", "assistant"]
    assert transcript[1]["content"][0]["text"] == "Hello from the model"
    listed = await run.json("sessions")
    assert [s["id"] for s in listed] == [sid]


async def test_watch_after_resumes_without_repeating(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    sid = await h.session([{"text": "one two three", "chunks": 3}])
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid)
    everything = await run.watch(sid)
    middle = everything[len(everything) // 2]["seq"]
    rest = await run.watch(sid, "--after", str(middle))
    assert [e["seq"] for e in rest] == [e["seq"] for e in everything if e["seq"] > middle]


async def test_interrupt_during_a_slow_tool(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    never = h.gate_file("never")
    sid = await h.session(
        [{"tool_call": {"id": "call_1", "name": "gate", "input": {"gate": never}}}],
        [{"text": "x"}],
    )
    await run.json("prompt", sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    status = await run.json("status", sid)
    assert status["busy"] is True and status["drain"]["running_tools"][0]["name"] == "gate"
    assert (await run.json("interrupt", sid)) == {"accepted": True, "status": "stopped"}
    events = await run.watch(sid)
    assert events[-1]["type"] == "session.execution.interrupted"
    assert (await run.json("interrupt", sid)) == {"accepted": False, "status": "idle"}


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("status", "ses_unknown"), "Session not found: ses_unknown", 1),
        (("show", "ses_missing"), "Session not found: ses_missing", 1),
        (
            ("new", "--workspace", "/nonexistent/dir", "--model", "scripted/x.json"),
            "does not exist",
            1,
        ),
        (("prompt", "bad id!", "hi"), "Invalid session id", 1),
    ],
)
async def test_user_errors_are_one_clear_line(
    cli: tuple[Cli, Harness], args: tuple[str, ...], message: str | None, code: int
) -> None:
    run, _ = cli
    done = await run.run(*args)
    assert done.returncode == code, done.stderr
    if message is not None:
        assert message in done.stderr
        assert "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) <= 2


async def test_a_bad_model_reference_is_refused(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    done = await run.run("new", "--workspace", str(h.workspace), "--model", "gpt-5")
    assert done.returncode == 1
    assert "use <provider>/<model>" in done.stderr and "Traceback" not in done.stderr


async def test_no_server_reachable_says_what_to_do(tmp_path: Path) -> None:
    cli = Cli("127.0.0.1:1", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "q")
    done = await cli.run("sessions")
    assert done.returncode == 2
    assert "sessionflow dev" in done.stderr and "Traceback" not in done.stderr


def _running(pid: int) -> bool:
    """Alive and not a zombie (this container's init does not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from sessionflow.devstack import stop_server
    from store import open_store

    address, ui_port, state = f"127.0.0.1:{free_port()}", free_port(), tmp_path / "state"
    command = [sys.executable, "-m", "sessionflow.cli", "--temporal", address, "demo"]
    command += ["--ui-port", str(ui_port), "--state-dir", str(state)]
    try:
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert done.returncode == 0, done.stdout + done.stderr
        session_id = next(
            line.split()[-1] for line in done.stdout.splitlines() if line.startswith("session id")
        )
        assert f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/session-{session_id}" in (
            done.stdout
        )
        store = await open_store(f"sqlite+aiosqlite:///{state / 'sessionflow.db'}")
        try:
            page = await store.events.read_after(session_id)
            settled = [e for e in page.events if e.type == "session.tool.success.1"]
            assert len(settled) == 5
        finally:
            await store.close()
        client = await Client.connect(address, data_converter=pydantic_data_converter)
        query = f"SessionId = '{session_id}'"
        found: list[str] = []
        for _ in range(50):  # visibility is eventually consistent
            found = [w.id async for w in client.list_workflows(query)]
            if found:
                break
            await asyncio.sleep(0.2)
        assert found == [f"session-{session_id}"]
    finally:
        stop_server(state)


async def test_dev_runs_the_stack_and_ctrl_c_stops_all_of_it(tmp_path: Path) -> None:
    import os
    import signal

    address, ui_port = f"127.0.0.1:{free_port()}", free_port()
    command = [sys.executable, "-m", "sessionflow.cli", "--temporal", address, "dev"]
    process = subprocess.Popen(
        [*command, "--ui-port", str(ui_port)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert process.stdout is not None
        lines = [await asyncio.to_thread(process.stdout.readline) for _ in range(3)]
        assert any("worker running" in line for line in lines), lines
        server_pid = int((tmp_path / ".sessionflow" / "temporal.pid").read_text())
        os.kill(server_pid, 0)  # the dev server runs
        process.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(process.wait, 30) in (0, 130)
        await asyncio.sleep(1)
        assert not _running(server_pid)
    finally:
        if process.poll() is None:
            process.kill()


async def test_approve_deny_answer_and_agent(cli: tuple[Cli, Harness]) -> None:
    from tests.workflows.harness import call
    from tests.workflows.test_permissions import asked

    runner, h = cli
    sid = await h.session(
        [call("b1", "bash", command="touch a"), call("b2", "bash", command="touch b")],
        [{"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    first, second = await asked(h, sid, 2)
    several = await runner.run("approve", sid)
    assert several.returncode == 1 and first.request_id in several.stderr
    assert (await runner.json("approve", sid, first.request_id))["status"] == "answered"
    denied = await runner.json("deny", sid, "--message", "not b")  # the only one left
    assert denied["request_id"] == second.request_id
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "a").exists() and not (h.workspace / "b").exists()
    unknown = await runner.run("answer", sid, "yes")
    assert unknown.returncode == 1 and "nothing in session" in unknown.stderr
    assert (await runner.json("agent", sid, "plan"))["agent"] == "plan"
    bad = await runner.run("agent", sid, "nobody")
    assert bad.returncode == 1 and "Unknown agent 'nobody'" in bad.stderr
