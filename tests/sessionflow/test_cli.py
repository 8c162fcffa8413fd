"""The CLI driven as a user would: subprocesses against a real dev server and SQLite store."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import Target
from tests.workflows.harness import Harness, harness
from tests.workflows.test_subagents import Tree, busy, task

ROOT = Path(__file__).parents[2]


class Cli:
    def __init__(
        self, address: str, database: str | None, task_queue: str, *, cwd: Path = ROOT
    ) -> None:
        self.base = [sys.executable, "-m", "sessionflow.cli", "--temporal", address]
        self.base += ["--database", database] if database else []
        self.base += ["--task-queue", task_queue]
        self.cwd = cwd

    async def run(
        self, *args: str, timeout: float = 180, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = await asyncio.to_thread(
            subprocess.run,
            [*self.base, *args],
            capture_output=True,
            input=stdin,
            timeout=timeout,
            cwd=self.cwd,
            # The worktree's packages, whatever directory the command runs from.
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
        )

    async def json(self, *args: str) -> Any:
        done = await self.run(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    async def watch(self, session: str, *extra: str, code: int | None = 0) -> list[dict[str, Any]]:
        """``watch --json --until-idle``'s events; its exit code must be ``code`` (any: None)."""
        done = await self.run("watch", session, "--json", "--until-idle", *extra)
        assert code is None or done.returncode == code, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]


@asynccontextmanager
async def cli_on(
    temporal_env: WorkflowEnvironment, tmp_path: Path, *, start_worker: bool = True
) -> AsyncIterator[tuple[Cli, Harness]]:
    """The CLI on a harness's store (a SQLite file) and task queue."""
    target = Target(f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}")
    store = await target.open()
    async with harness(temporal_env.client, store, tmp_path, start_worker=start_worker) as h:
        address = temporal_env.client.service_client.config.target_host
        yield Cli(address, target.url, h.client.task_queue), h
    await store.close()


@pytest.fixture
async def cli(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Cli, Harness]]:
    async with cli_on(temporal_env, tmp_path) as running:
        yield running


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
    roundabout = f"{h.workspace}/../{h.workspace.name}/"
    assert [s["id"] for s in await run.json("sessions", "--directory", roundabout)] == [sid]
    # Bytes that are not UTF-8 reach Python as lone surrogates: refused at the edge, in a line.
    hostile = await run.run("prompt", sid, "bad \udcff byte")
    assert hostile.returncode == 1 and "lone surrogate" in hostile.stderr, hostile.stderr
    assert len(hostile.stderr.strip().splitlines()) <= 2 and "Traceback" not in hostile.stderr


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
    assert (await run.json("interrupt", sid)) == {
        "accepted": True,
        "status": "stopped",
        "detail": None,
    }
    events = await run.watch(sid, code=3)  # the last busy period was interrupted
    assert events[-1]["type"] == "session.execution.interrupted"
    assert (await run.json("interrupt", sid)) == {
        "accepted": False,
        "status": "idle",
        "detail": None,
    }


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("status", "ses_unknown"), "Session not found: ses_unknown", 1),
        (("show", "ses_missing"), "Session not found: ses_missing", 1),
        (
            (
                "new",
                "--workspace",
                "/nonexistent/dir",
                "--model",
                "openai/gpt-5",
                "--key-on-workers",
            ),
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


async def test_a_real_model_without_its_api_key_is_refused(
    cli: tuple[Cli, Harness], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: ``new`` took a real model with no key, and its first turn failed."""
    run, h = cli
    for variable in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SESSIONFLOW_OPENAI_CHAT_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("SESSIONFLOW_OPENAI_CHAT_BASE_URL", raising=False)
    for model, variable in (
        ("openai/gpt-5", "set OPENAI_API_KEY"),
        ("anthropic/claude-sonnet-4-5", "set ANTHROPIC_API_KEY"),
        ("openai-chat/llama3", "set SESSIONFLOW_OPENAI_CHAT_API_KEY or OPENAI_API_KEY"),
    ):
        done = await run.run("new", "--workspace", str(h.workspace), "--model", model)
        assert done.returncode == 1 and variable in done.stderr, done.stderr
        assert "--key-on-workers" in done.stderr and "Traceback" not in done.stderr
    assert await h.store.sessions.list() == []
    monkeypatch.setenv("SESSIONFLOW_OPENAI_CHAT_BASE_URL", "http://127.0.0.1:11434/v1")
    local = await run.json("new", "--workspace", str(h.workspace), "--model", "openai-chat/llama3")
    on_workers = await run.json(
        "new", "--workspace", str(h.workspace), "--model", "openai/gpt-5", "--key-on-workers"
    )
    assert len(await h.store.sessions.list()) == 2 and local != on_workers


async def test_new_sets_the_system_prompt_rules_network_and_approval_timeout(
    cli: tuple[Cli, Harness],
) -> None:
    """Issue 32: what the SDK and HTTP could set, ``new`` could not."""
    run, h = cli
    model = h.script([{"text": "x"}])
    created = await run.json(
        "new", "--workspace", str(h.workspace), "--model", model,
        "--system", "Answer in French.", "--allow", "bash:pytest *", "--deny", "write",
        "--ask", "bash:git push*", "--network", "--approval-timeout", "30",
    )  # fmt: skip
    settings = (await h.store.sessions.get(created["session_id"])).settings
    assert settings["system"] == "Answer in French."
    assert settings["permissions"] == [
        {"tool": "bash", "pattern": "pytest *", "action": "allow"},
        {"tool": "bash", "pattern": "git push*", "action": "ask"},
        {"tool": "write", "pattern": "*", "action": "deny"},
    ]
    assert (settings["network"], settings["approval_timeout"]) == (True, 30)
    bad = await run.run("new", "--workspace", str(h.workspace), "--model", model, "--allow", ":x")
    assert bad.returncode == 1 and "give TOOL[:PATTERN]" in bad.stderr


async def test_no_server_reachable_says_what_to_do(tmp_path: Path) -> None:
    cli = Cli("127.0.0.1:1", f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", "q")
    done = await cli.run("new", "--workspace", str(tmp_path), "--model", "scripted/x.json")
    assert done.returncode == 2
    assert "sessionflow dev" in done.stderr and "Traceback" not in done.stderr


def _running(pid: int) -> bool:
    from sessionflow.devstack import alive

    return alive(pid)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_demo_then_dev_reuse_a_server_with_its_own_ui_port_and_state_per_port(
    tmp_path: Path,
) -> None:
    """demo starts a dev server (UI port chosen free, recorded per port); dev from the same
    directory reuses it and prints that UI, not 8233; a second dev on another port keeps its
    own state files and Ctrl-C stops only the server it started; a port taken by something
    else is named as such, and no pid file is left behind."""
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from sessionflow.devstack import stop_server
    from store import open_store

    port, state = free_port(), tmp_path / ".sessionflow"
    stack = Cli(f"127.0.0.1:{port}", None, "sessionflow-demo", cwd=tmp_path)
    try:
        done = await stack.run("demo", timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        ui_port = int((state / f"temporal-{port}.ui").read_text())
        session_id = next(
            line.split()[-1] for line in done.stdout.splitlines() if line.startswith("session id")
        )
        link = f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/session-{session_id}"
        assert link in done.stdout
        assert re.search(rf"live page http://127\.0\.0\.1:\d+/view/{session_id}", done.stdout)
        assert "the live page closed with the demo; `sessionflow dev` from here" in done.stdout
        # The in-process worker logs to a file, never into the streamed text (issue 32).
        assert (state / "demo.log").exists() and "INFO" not in done.stderr
        store = await open_store(f"sqlite+aiosqlite:///{state / 'sessionflow.db'}")
        try:
            page = await store.events.read_after(session_id)
            settled = [e for e in page.events if e.type == "session.tool.success.1"]
            assert len(settled) == 5
        finally:
            await store.close()
        client = await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
        found: list[str] = []
        for _ in range(50):  # visibility is eventually consistent
            found = [w.id async for w in client.list_workflows(f"SessionId = '{session_id}'")]
            if found:
                break
            await asyncio.sleep(0.2)
        assert found == [f"session-{session_id}"]

        reused = await _dev_lines(tmp_path, port)
        assert f"Temporal UI: http://127.0.0.1:{ui_port}" in reused[1], reused
        assert "already running" in reused[0] and str(state / "sessionflow.db") in reused[2]
        await client.count_workflows()  # the reused server outlived the dev that reused it

        other = free_port()
        lines = await _dev_lines(tmp_path, other, check_pid=True)
        assert "(started)" in lines[0]
        assert (state / f"temporal-{port}.pid").exists()  # the first one's state is untouched

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            busy = taken.getsockname()[1]
            refused = await Cli(f"127.0.0.1:{busy}", None, "q", cwd=tmp_path).run("dev")
        assert refused.returncode == 2
        assert f"port {busy} on 127.0.0.1 is taken by something that is not a Temporal" in (
            refused.stderr
        )
        assert not (state / f"temporal-{busy}.pid").exists()
    finally:
        stop_server(state, port)


async def _dev_lines(cwd: Path, port: int, *, check_pid: bool = False) -> list[str]:
    """Run ``dev`` until its worker runs, then Ctrl-C it; its first lines."""
    command = [sys.executable, "-m", "sessionflow.cli", "--temporal", f"127.0.0.1:{port}", "dev"]
    process = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert process.stdout is not None
        lines = [await asyncio.to_thread(process.stdout.readline) for _ in range(5)]
        assert lines[-1].startswith("worker running"), lines
        api = lines[3].removeprefix("API and live page: ").strip()
        health = await asyncio.to_thread(urllib.request.urlopen, f"{api}/healthz", timeout=10)
        assert json.loads(health.read()) == {
            "store": True,
            "temporal": True,
            "streams": 0,
            "followers": 0,
            "held_bytes": 0,
        }
        pid_file = cwd / ".sessionflow" / f"temporal-{port}.pid"
        server_pid = int(pid_file.read_text()) if check_pid else None
        process.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(process.wait, 30) in (0, 130)
        if server_pid is not None:  # dev ends once the server it started has exited
            assert not _running(server_pid) and not pid_file.exists()
        return lines
    finally:
        if process.poll() is None:
            process.kill()


async def test_compact_through_the_cli(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    model = h.script([{"text": "first answer"}], [{"text": "cli summary"}])
    created = await run.json("new", "--workspace", str(h.workspace), "--model", model)
    sid = created["session_id"]
    await run.json("prompt", sid, "Hello")
    await h.client.wait_idle(sid, timeout=30)
    answer = await run.json("compact", sid)
    await h.client.wait_idle(sid, timeout=30)
    compaction = next(m for m in await h.messages(sid) if m.type == "compaction")
    assert (compaction.id, compaction.status, compaction.summary) == (
        answer["input_id"],
        "completed",
        "cli summary",
    )
    shown = await run.run("show", sid)
    assert "compaction manual · completed cli summary" in shown.stdout, shown.stdout
    watched = await run.run("watch", sid, "--until-idle")
    assert "compacting (manual)" in watched.stdout and "cli summary" in watched.stdout
    assert "✓ compacted 11 characters of summary" in watched.stdout, watched.stdout
    missing = await run.run("compact", "ses_missing")
    assert missing.returncode == 1 and "ses_missing" in missing.stderr


async def test_one_store_wherever_the_cli_runs_and_reading_never_creates_one(
    temporal_env: WorkflowEnvironment, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """From a project's subdirectory, with no --database, the CLI uses the .sessionflow/ above
    it (the worker's store); relative workspace and script paths are the CLI's, stored
    absolute; prompts come from --file or stdin, of any size, NUL included; reading commands
    elsewhere create nothing and name the store they looked for."""
    state = tmp_path / ".sessionflow"
    store = await Target(f"sqlite+aiosqlite:///{state / 'sessionflow.db'}").open()
    project = tmp_path / "proj" / "sub"
    project.mkdir(parents=True)
    (project / "model.json").write_text(
        json.dumps({"turns": [{"events": [{"text": "one"}]}, {"events": [{"text": "two"}]}]})
    )
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            address = temporal_env.client.service_client.config.target_host
            run = Cli(address, None, h.client.task_queue, cwd=project)
            help_text = "".join((await run.run("--help")).stdout.split())
            assert str(state / "sessionflow.db") in help_text
            created = await run.json("new", "--workspace", ".", "--model", "scripted/model.json")
            sid = created["session_id"]
            info = await h.client.session(sid)
            assert info.directory == str(project)
            assert str(info.model) == f"scripted/{project / 'model.json'}"
            big = "x" * 200_000 + "\x00 after a NUL"
            (project / "prompt.txt").write_text(big)
            from_file = await run.run("prompt", sid, "--file", "prompt.txt")
            assert from_file.returncode == 0, from_file.stderr
            await h.client.wait_idle(sid)
            piped = await run.run("prompt", sid, "--queue", stdin=b"from stdin")
            assert piped.returncode == 0, piped.stderr
            events = await run.watch(sid)
            assert [e["type"] for e in events].count("session.execution.succeeded") == 2
            texts = [m.text for m in await h.messages(sid) if m.type == "user"]
            assert texts == [big, "from stdin"]
            assert not (project / ".sessionflow").exists()
            assert not (tmp_path / "proj" / ".sessionflow").exists()

            elsewhere = tmp_path_factory.mktemp("elsewhere")  # no .sessionflow/ above it
            lost = Cli(address, None, h.client.task_queue, cwd=elsewhere)
            for args in (("sessions",), ("status", sid)):
                done = await lost.run(*args)
                assert done.returncode == 1, done.stderr
                wanted = f"no store at {elsewhere / '.sessionflow' / 'sessionflow.db'}"
                assert wanted in done.stderr, done.stderr
            missing = tmp_path / "nonexistent" / "dir" / "x.db"
            done = await lost.run("--database", f"sqlite+aiosqlite:///{missing}", "show", sid)
            assert done.returncode == 1 and "no store at" in done.stderr, done.stderr
            assert not (elsewhere / ".sessionflow").exists() and not missing.parent.exists()
            down = await lost.run(
                "--database", "postgresql+psycopg://root@127.0.0.1:1/x", "show", sid
            )
            assert down.returncode == 2, down.stderr
            assert len(down.stderr.strip().splitlines()) == 1 and "Traceback" not in down.stderr
            assert "cannot reach the store or Temporal (store postgresql" in down.stderr
            unknown = await run.run("status", "ses_unknown")
            assert unknown.returncode == 1
            assert f"store sqlite+aiosqlite:///{state / 'sessionflow.db'}" in unknown.stderr
    finally:
        await store.close()


async def test_without_a_worker_every_answer_says_so_and_a_worker_command_takes_the_options(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """No worker polls: status, resume and interrupt answer at once and name the task queue
    and the pending inputs; wait_idle keeps waiting. The interrupt is queued until a worker is
    back and then comes first: the prompt woken before it does not run (it stays pending, and
    wait_idle's status says so) until a resume. `sessionflow worker` with the global options
    (not the defaults) picks the session up; a script that fails to load at run time reaches
    resume as the outcome's error text, the worker logs it in one line, and it uses up no
    turn: once the script is back, the next request plays its first turn."""
    target = Target(f"sqlite+aiosqlite:///{tmp_path / 'cli.db'}")
    store = await target.open()
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        address = temporal_env.client.service_client.config.target_host
        queue = h.client.task_queue
        run = Cli(address, target.url, queue)
        model = h.script([{"text": "at last"}])
        sid = (await run.json("new", "--workspace", str(h.workspace), "--model", model))[
            "session_id"
        ]
        await run.json("prompt", sid, "Anyone there?")
        waiting = f"no worker is polling task queue {queue} (1 pending input waits for one)"
        status = await run.json("status", sid)
        assert status["busy"] is False and waiting in status["waiting_for_worker"]
        resumed = await run.run("resume", sid)
        assert resumed.returncode == 2 and waiting in resumed.stderr
        interrupted = await run.run("interrupt", sid)
        assert interrupted.returncode == 0, interrupted.stderr
        assert interrupted.stdout.startswith(f"queued until a worker is back: {waiting}")
        with pytest.raises(TimeoutError, match=re.escape(f"not idle after 0.1 s: {waiting}")):
            await h.client.wait_idle(sid, timeout=0.1)

        gone = h.script([{"text": "never"}], name="gone.json")
        broken = (await run.json("new", "--workspace", str(h.workspace), "--model", gone))[
            "session_id"
        ]
        Path(gone.removeprefix("scripted/")).unlink()
        await run.json("prompt", broken, "Go", "--no-wake")

        log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen(
            [*run.base, "worker"],
            cwd=tmp_path,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(ROOT), "SESSIONFLOW_TOOLS": "builtin"},
        )
        try:
            idle = await h.client.wait_idle(sid, timeout=60)
            assert (idle.busy, idle.pending_inputs, idle.waiting_for_worker) == (False, 1, None)
            # The interrupt claimed the prompt's wake: watch says it stays unrun (exit 4).
            types = [e["type"] for e in await run.watch(sid, code=4)]
            assert "session.execution.started" not in types, types
            assert "session.prompt.promoted" not in types and h.requests() == []
            again = await run.run("resume", sid)
            assert (again.returncode, again.stdout.strip()) == (0, "succeeded"), again.stderr

            outcome = await run.run("resume", broken)
            assert outcome.returncode == 3, outcome.stdout + outcome.stderr
            assert "failed: ScriptError: Scripted model file not found" in outcome.stdout
            h.script([{"text": "the first turn"}], name="gone.json")
            fixed = await run.run("resume", broken)
            assert (fixed.returncode, fixed.stdout.strip()) == (0, "succeeded"), fixed.stdout
            shown = await run.json("show", broken)
            assert [m["type"] for m in shown] == ["user", "assistant"]
            assert shown[1]["content"][0]["text"] == "the first turn"
        finally:
            worker.send_signal(signal.SIGINT)
            await asyncio.to_thread(worker.wait, 30)
            log.close()
        logged = (tmp_path / "worker.log").read_text()
        assert f"polling {queue} on {address}, store {target.url}" in logged
        assert "(expected, handled): ScriptError" in logged and "Traceback" not in logged
    await store.close()


async def test_watch_replays_every_busy_period_and_says_how_the_last_one_ended(
    cli: tuple[Cli, Harness], tmp_path: Path
) -> None:
    """--until-idle shows all busy periods, exits on an idle session even after its last seq,
    and exits 3 when the last busy period failed; tool durations are the events' own; tool
    output shows its first lines (all with --full); a closed pipe ends it quietly."""
    run, h = cli
    output = "\n".join(f"line {n}" for n in range(1, 13))
    gate = h.gate_file("slow")
    waiting = {"gate": gate, "text": output, "progress": "waiting for the gate"}
    sid = await h.session(
        [{"text": "first period"}],
        [{"tool_call": {"id": "c1", "name": "gate", "input": waiting}}],
        [{"text": "second period " * 400, "chunks": 400}],
        [{"error": {"kind": "invalid_request", "message": "the model refused"}}],
    )
    await h.client.prompt(sid, "one " + "x" * 3000)
    await h.client.wait_idle(sid)
    await h.client.prompt(sid, "two")
    await h.until(lambda: h.gate.active == 1)
    h.open_gate("slow")
    await h.client.wait_idle(sid)
    await h.client.prompt(sid, "three")
    await h.client.wait_idle(sid)

    events = await run.watch(sid, code=3)
    ends = ("session.execution.succeeded", "session.execution.failed")
    terminals = [e["type"] for e in events if e["type"] in ends]
    assert terminals[-1] == "session.execution.failed"
    assert terminals.count("session.execution.succeeded") == 2
    called = next(e for e in events if e["type"] == "session.tool.called")
    settled = next(e for e in events if e["type"] == "session.tool.success")
    took = settled["created"] - called["created"]

    text = await run.run("watch", sid, "--until-idle")
    assert text.returncode == 3, text.stderr
    assert "first period" in text.stdout and "second period" in text.stdout
    assert f"✓ gate {took} ms" in text.stdout
    assert "│ line 5" in text.stdout and "│ line 6" not in text.stdout
    assert "7 more line(s); --full shows all" in text.stdout
    assert "the model refused" in text.stdout
    assert "… gate waiting for the gate" in text.stdout  # tool.progress
    cut = "x" * 1996 + "… [1004 more characters; --full shows all]"
    assert cut in text.stdout.replace("\n", "")  # the terminal may wrap it
    full = await run.run("watch", sid, "--until-idle", "--full")
    assert "│ line 12" in full.stdout and "x" * 3000 in full.stdout.replace("\n", "")

    shown = await run.run("show", sid)  # prompts cut with a marker, tool results' first lines
    assert shown.returncode == 0, shown.stderr
    assert cut in shown.stdout.replace("\n", "")
    assert "tool gate completed" in shown.stdout and "│ line 5" in shown.stdout
    assert "│ line 6" not in shown.stdout and "7 more line(s); --full shows all" in shown.stdout
    whole = await run.run("show", sid, "--full")
    assert "x" * 3000 in whole.stdout.replace("\n", "") and "│ line 12" in whole.stdout

    after = await run.run("watch", sid, "--until-idle", "--after", str(events[-1]["seq"]))
    assert after.returncode == 3 and after.stdout == "", after.stderr

    err = tmp_path / "watch.err"
    piped = await asyncio.to_thread(
        subprocess.run,
        f"{' '.join(run.base)} watch {sid} --json --until-idle 2>{err} | head -1; "
        "exit ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert piped.returncode == 0 and len(piped.stdout.splitlines()) == 1
    assert err.read_text() == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("new", "--workspace", "{file}", "--model", "{model}"), "is not a directory"),
        (("new", "--workspace", "{dir}", "--model", "foo/bar"), "Unknown model provider 'foo'"),
        (("new", "--workspace", "{dir}", "--model", "scripted/missing.json"), "not found"),
        (("new", "--workspace", "{dir}", "--model", "scripted/{bad}"), "{bad}:4: turns[0]"),
        (("check-script", "{bad}"), "read has no input 'file' (it takes limit, offset, path)"),
    ],
)
async def test_a_session_is_checked_when_it_is_created(
    cli: tuple[Cli, Harness], args: tuple[str, ...], message: str
) -> None:
    run, h = cli
    bad = h.root / "bad.json"
    bad.write_text(
        '{"turns": [\n  {"events": [\n    {"text": "hi"},\n'
        '    {"tool_call": {"id": "c1", "name": "read", "input": {"file": "a.py"}}}\n  ]}\n]}'
    )
    (h.workspace / "a.py").write_text("")
    names = {"file": str(h.workspace / "a.py"), "dir": str(h.workspace), "bad": str(bad)}
    names["model"] = h.script([{"text": "x"}])
    done = await run.run(*(a.format(**names) for a in args))
    assert done.returncode == 1, done.stderr
    assert message.format(**names) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert await h.store.sessions.list() == []


def test_help_is_plain_fast_and_complete() -> None:
    """--help imports neither Temporal nor the store; every option says what it does; flags
    render as flags."""
    import typer.main

    from sessionflow.cli import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    probe = (
        "import sys\n"
        "from sessionflow.cli import app\n"
        f"for name in {['', *sorted(group.commands)]!r}:\n"
        "    sys.argv = ['sessionflow', *([name] if name else []), '--help']\n"
        "    try:\n        app()\n"
        "    except SystemExit:\n        pass\n"
        "heavy = ('temporalio', 'sqlalchemy', 'store', 'rich', 'worker', 'activities')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert done.stdout.strip().endswith("[]"), done.stdout  # nothing heavy imported
    assert "--json " in done.stdout and "<bool>" not in done.stdout
    for name, command in group.commands.items():
        for param in command.params:
            assert getattr(param, "help", None), f"{name} {param.name} has no help"


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
    status = await runner.run("status", sid)
    assert f"waits for an answer: {first.request_id} (bash: touch a)" in status.stdout
    assert f"waits for an answer: {second.request_id} (bash: touch b)" in status.stdout
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


async def test_answer_refuses_an_ask_and_approve_a_question(cli: tuple[Cli, Harness]) -> None:
    """Issue 32: ``answer S dev`` approved a waiting shell command, which ran."""
    from tests.workflows.harness import call
    from tests.workflows.test_permissions import asked

    runner, h = cli
    sid = await h.session([call("b1", "bash", command="touch a")], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    for args in (("answer", sid, "dev"), ("answer", sid, "dev", "--request", request.request_id)):
        crossed = await runner.run(*args)
        assert crossed.returncode == 1, crossed
        assert "is a permission ask, not a question (bash: touch a)" in crossed.stderr
        assert f"sessionflow approve {sid} {request.request_id}" in crossed.stderr
    assert not (h.workspace / "a").exists()
    assert (await runner.json("deny", sid))["status"] == "answered"
    await h.client.wait_idle(sid, timeout=30)

    sid = await h.session([call("q1", "question", question="Which?")], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    for command in ("approve", "deny"):
        crossed = await runner.run(command, sid)
        assert crossed.returncode == 1, crossed
        assert "is a question, not a permission ask ('Which?')" in crossed.stderr
        assert f"sessionflow answer {sid} TEXT --request {request.request_id}" in crossed.stderr
    assert (await runner.json("answer", sid, "that one"))["status"] == "answered"
    await h.client.wait_idle(sid, timeout=30)


async def test_the_last_step_says_that_the_step_limit_disabled_its_tools(
    cli: tuple[Cli, Harness],
) -> None:
    run, h = cli
    model = h.script(
        [
            {"text": "Let me look."},
            {"tool_call": {"id": "c1", "name": "read", "input": {"path": "a.py"}}},
        ],
        [{"text": "asked again"}],
    )
    created = await run.json(
        "new", "--workspace", str(h.workspace), "--model", model, "--max-steps", "1"
    )
    await run.json("prompt", created["session_id"], "Look around")
    events = await run.watch(created["session_id"])
    failed = next(e for e in events if e["type"] == "session.tool.failed")
    assert failed["data"]["error"]["message"] == (
        "Tool is not available for this request: read (the step limit was reached: "
        "max_steps=1; tools are disabled until the next prompt)"
    )
    text = await run.run("watch", created["session_id"], "--until-idle")
    assert "✗ read" in text.stdout and "max_steps=1" in text.stdout
    # Nothing pending: resume asks the model again on the history, and says so first.
    again = await run.run("resume", created["session_id"])
    assert again.returncode == 0 and again.stdout.strip() == "succeeded", again.stderr
    assert "nothing is pending: resume asks the model once more" in again.stderr
    assert len(h.requests()) == 2


async def test_dev_reusing_a_server_started_elsewhere_prints_its_real_ui_port(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A dev server started by hand, from another directory, on a UI port that is neither
    port + 1000 nor what a stale state file here recorded: `dev` prints the one it serves."""
    from tests.conftest import temporal_binary

    port, ui_port = free_port(), free_port()
    state = tmp_path / ".sessionflow"
    state.mkdir()
    (state / f"temporal-{port}.ui").write_text(str(free_port()))  # left by an older server
    elsewhere = tmp_path_factory.mktemp("server")
    command = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1"]
    command += ["--port", str(port), "--ui-port", str(ui_port), "--log-level", "error"]
    server = subprocess.Popen(command, cwd=elsewhere, stdout=subprocess.DEVNULL)
    try:
        from sessionflow.devstack import connect

        for _ in range(150):
            if await connect(f"127.0.0.1:{port}", seconds=1.0) is not None:
                break
            await asyncio.sleep(0.2)
        lines = await _dev_lines(tmp_path, port)
        assert "already running" in lines[0], lines
        assert lines[1].strip() == f"Temporal UI: http://127.0.0.1:{ui_port}", lines
    finally:
        server.terminate()
        await asyncio.to_thread(server.wait, 30)


async def test_new_takes_the_compaction_settings_and_the_agent(cli: tuple[Cli, Harness]) -> None:
    run, h = cli
    model = h.script([{"text": "x"}])
    created = await run.json(
        "new",
        "--workspace",
        str(h.workspace),
        "--model",
        model,
        "--no-auto-compact",
        "--compaction-buffer",
        "1000",
        "--keep-tokens",
        "300",
        "--compaction-model",
        model,
        "--agent",
        "plan",
    )
    info = await h.store.sessions.get(created["session_id"])
    assert info.settings["compaction"] == {
        "auto": False,
        "buffer": 1000,
        "keep_tokens": 300,
        "model": model,
    }
    assert info.agent == "plan"
    defaults = await run.json("new", "--workspace", str(h.workspace), "--model", model)
    assert "compaction" not in (await h.store.sessions.get(defaults["session_id"])).settings
    bad = await run.run("new", "--workspace", str(h.workspace), "--model", model, "--agent", "x")
    assert bad.returncode == 1 and "Unknown agent 'x'" in bad.stderr
    negative = await run.run(
        "new", "--workspace", str(h.workspace), "--model", model, "--keep-tokens", "-1"
    )
    # A mistyped command line is the user's error (1): 2 is reserved for "unreachable".
    assert negative.returncode == 1 and "--keep-tokens" in negative.stderr


async def test_global_options_after_the_subcommand_are_honoured(cli: tuple[Cli, Harness]) -> None:
    """Issue 32: ``sessionflow status S --database URL`` was refused with exit 2."""
    run, h = cli
    sid = await h.session([{"text": "x"}])
    after = Cli(run.base[4], None, "unused", cwd=run.cwd)
    database = run.base[run.base.index("--database") + 1]
    queue = f"--task-queue={h.client.task_queue}"
    done = await after.run("status", sid, "--database", database, queue, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["session_id"] == sid
    unknown = await after.run("status", sid, "--no-such-flag")
    assert unknown.returncode == 1 and "No such option" in unknown.stderr


def _read_until(fd: int, marker: bytes, seen: bytearray) -> bytes:
    """Read a pty into ``seen`` until ``marker`` shows (or the other side closes)."""
    deadline = time.monotonic() + 60
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} within 60 s: {bytes(seen)!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side is gone
            break
        if not chunk:
            break
        seen.extend(chunk)
    return bytes(seen)


async def test_watch_on_a_terminal_offers_each_waiting_call_for_an_answer(
    cli: tuple[Cli, Harness],
) -> None:
    """``watch`` on a terminal shows a call that waits for approval and offers y / a / n: a
    request that waited before the watch began, and one asked while it watches."""
    from tests.workflows.harness import call
    from tests.workflows.test_permissions import asked

    run, h = cli
    sid = await h.session(
        [call("b1", "bash", command="touch a")],
        [call("b2", "bash", command="touch b")],
        [{"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    (first,) = await asked(h, sid)
    controller, terminal = pty.openpty()
    watch = subprocess.Popen(
        [*run.base, "watch", sid, "--until-idle"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        cwd=run.cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )
    os.close(terminal)
    seen = bytearray()
    try:
        shown = await asyncio.to_thread(_read_until, controller, b"allow?", seen)
        assert first.request_id.encode() in shown and b"bash asks" in shown
        seen.clear()
        os.write(controller, b"y\n")
        shown = await asyncio.to_thread(_read_until, controller, b"allow?", seen)
        assert b"once" in shown and b"touch b" in shown  # the reply, then the next ask
        os.write(controller, b"n\n")
        code = await asyncio.to_thread(watch.wait, 60)
    finally:
        if watch.poll() is None:
            watch.kill()
        os.close(controller)
    assert (h.workspace / "a").exists() and not (h.workspace / "b").exists()
    replies = [e.data for e in await h.events(sid) if e.type == "session.permission.replied"]
    assert [r["decision"] for r in replies] == ["once", "reject"]
    assert code == 3  # the rejection without a message stopped the busy period (interrupted)


@pytest.mark.parametrize(
    ("command", "variable", "value", "told"),
    [
        ("worker", "SESSIONFLOW_LEASE_MS", "abc", "SESSIONFLOW_LEASE_MS='abc': Input should be"),
        ("worker", "SESSIONFLOW_BATCH_MS", "0", "SESSIONFLOW_BATCH_MS='0': Input should be"),
        ("serve", "SESSIONFLOW_API_PORT", "http", "SESSIONFLOW_API_PORT='http': Input should be"),
    ],
)
def test_a_bad_setting_names_the_variable_the_user_set(
    tmp_path: Path, command: str, variable: str, value: str, told: str
) -> None:
    """An invalid environment variable is named as the user spelled it (not the field it
    fills), with its value and what to do, in one line before anything starts."""
    done = subprocess.run(
        [sys.executable, "-m", "sessionflow.cli", "--temporal", "127.0.0.1:1", command],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), variable: value},
    )
    assert done.returncode == 1, done.stderr
    assert told in done.stderr and "unset the variable" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


async def test_dev_in_one_directory_and_the_cli_in_an_unrelated_one_share_one_store(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """`dev` in A publishes its store for its address and queue; from an unrelated B (no
    .sessionflow/ upward) new, prompt and watch use it, and the session runs. A B that has a
    store of its own (say an earlier `new` there) is refused at `new`, naming both stores, and
    nothing is created in it."""
    from sessionflow import locate

    address = temporal_env.client.service_client.config.target_host
    queue = f"dev-{os.getpid()}-{time.monotonic_ns()}"
    here, project = tmp_path / "a", tmp_path / "b"
    here.mkdir(), project.mkdir()
    script = project / "model.json"
    script.write_text(json.dumps({"turns": [{"events": [{"text": "from A's worker"}]}]}))
    dev = subprocess.Popen(
        [*Cli(address, None, queue).base, "dev"],
        cwd=here,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert dev.stdout is not None
        lines = [await asyncio.to_thread(dev.stdout.readline) for _ in range(5)]
        assert lines[-1].startswith("worker running"), lines
        stores = here / ".sessionflow" / "sessionflow.db"
        run = Cli(address, None, queue, cwd=project)
        made = await run.json("new", "--workspace", ".", "--model", "scripted/model.json")
        sid = made["session_id"]
        await run.json("prompt", sid, "Hello")
        events = await run.watch(sid)
        assert events[-1]["type"] == "session.execution.succeeded"
        assert "from A's worker" in "".join(e["data"].get("delta", "") for e in events)
        assert not (project / ".sessionflow").exists()

        (project / ".sessionflow").mkdir()  # B's own store now comes first, and is not theirs
        refused = await run.run("new", "--workspace", ".", "--model", "scripted/model.json")
        assert refused.returncode == 1, refused.stderr
        ours = project / ".sessionflow" / "sessionflow.db"
        assert f"write to sqlite+aiosqlite:///{stores}" in refused.stderr, refused.stderr
        assert f"not to this store (sqlite+aiosqlite:///{ours}" in refused.stderr
        assert "--database" in refused.stderr and "Traceback" not in refused.stderr
        listed = await Cli(address, f"sqlite+aiosqlite:///{ours}", queue).json("sessions")
        assert listed == []
    finally:
        dev.send_signal(signal.SIGINT)
        await asyncio.to_thread(dev.wait, 30)
    assert locate.running(address, queue) == []  # the record left with dev


async def test_children_jobs_and_the_status_of_a_tree(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with cli_on(temporal_env, tmp_path, start_worker=False) as (run, h):
        tree = Tree(h)
        tree.subagent("fg", [{"wait_for_file": h.gate_file("fg")}, {"text": "fg answer"}])
        tree.subagent("bg", [{"wait_for_file": h.gate_file("bg")}, {"text": "bg answer"}])
        sid = await h.session(
            [task("t1", "bg", background=True)],
            [task("t2", "fg")],
            [{"text": "done"}],
            [{"text": "read the job's answer"}],
        )
        async with tree.worker():
            await h.client.prompt(sid, "Delegate")

            async def both_running() -> bool:
                kids = await h.client.children(sid)
                return len(kids) == 2 and all([await busy(h, k.id) for k in kids])

            await h.until(both_running, timeout=30)
            kids = {k.agent: k.id for k in await h.client.children(sid)}
            listed = await run.json("children", sid)
            assert [c["id"] for c in listed] == [kids["bg"], kids["fg"]]
            (job,) = await run.json("jobs", sid)
            assert job["session"]["id"] == kids["bg"] and job["running"]
            status = await run.run("status", sid)
            assert status.returncode == 0, status.stderr
            assert f"subagent {kids['fg']}:" in status.stdout
            nested = await run.json("status", sid)
            assert [s["session_id"] for s in nested["subagents"]] == [kids["fg"]]
            text = await run.run("children", sid)
            assert f"{kids['bg']}  @bg" in text.stdout and "background" in text.stdout
            shown = " ".join((await run.run("show", sid)).stdout.split())  # lines wrap at 80
            for child in kids.values():  # the running call and the settled background one
                assert f"subagent session {child}: sessionflow show {child}" in shown
            h.open_gate("fg")
            h.open_gate("bg")
            await h.until(lambda: len(h.requests()) == 4, timeout=30)
            await h.client.wait_idle(sid, timeout=30)
            (job,) = await run.json("jobs", sid)
            assert not job["running"] and job["outcome"] == "succeeded"
            jobs = await run.run("jobs", sid)
            assert f"{kids['bg']}  @bg  succeeded" in jobs.stdout
            spent = await run.json("usage", sid)
            assert sorted(c["session_id"] for c in spent["children"]) == sorted(kids.values())
            text = (await run.run("usage", sid)).stdout
            assert f"  {kids['fg']}  @fg  in " in text and "total  in " in text
        unknown = await run.run("jobs", "ses_nope")
        assert unknown.returncode == 1 and "ses_nope" in unknown.stderr, unknown.stderr


async def test_budget_new_status_and_resume_from_the_command_line(
    cli: tuple[Cli, Harness],
) -> None:
    run, h = cli
    finish = {"finish": {"reason": "tool-calls", "usage": {"input": 1000}}}
    model = h.script(
        [{"tool_call": {"id": "c1", "name": "echo", "input": {"text": "x"}}}, finish],
        [{"text": "continued"}],
        price={"input": 1000.0, "output": 1000.0},
    )
    made = await run.json(
        "new", "--workspace", str(h.workspace), "--model", model, "--budget-usd", "0.5"
    )
    sid = made["session_id"]
    await run.json("prompt", sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    state = await run.run("status", sid)
    assert state.returncode == 0, state.stderr
    assert "$1.0000 · budget reached: $1.0000 spent of $0.5 (+$0.5000)" in state.stdout
    shown = await run.run("budget", sid)
    assert "sessionflow resume" in shown.stdout and "budget $0.5" in shown.stdout
    raised = await run.json("budget", sid, "--usd", "5", "--tokens", "90000")
    assert raised["budget"] == {"usd": 5.0, "tokens": 90000}
    assert raised["budget_reached"] is None
    bad = await run.run("budget", sid, "--usd", "-3")
    assert bad.returncode != 0 and "Invalid budget" in bad.stderr
    assert (await run.json("budget", sid))["budget"] == {"usd": 5.0, "tokens": 90000}
    outcome = await run.json("resume", sid)
    assert outcome["type"] == "succeeded"
    assert len(h.requests()) == 2
