"""``bash``: commands die with their call, whole groups included, and leave nothing behind
(reference catalogue D8, C1).

Processes are found independently of the code under test: by a unique marker in their command
line (``sleep 900.<marker>``), scanning ``/proc``. Zombies do not count as left behind: an
orphan we killed is reaped by init, which in some containers never reaps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from pathlib import Path

import pytest

from activities.tools import process
from activities.tools.base import ToolFailure, ToolOutput
from activities.tools.builtin import builtin_registry
from tests.activities.tools.conftest import SETTINGS, Sandbox, text


def marker() -> str:
    return str(uuid.uuid4().int % 10**9)


def live(mark: str, program: bytes = b"") -> list[int]:
    """Live (not zombie) processes whose command line holds ``mark`` (and starts with
    ``program``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2 :].split()[0]
        ours = mark.encode() in cmdline and cmdline.startswith(program)
        if ours and state not in (b"Z", b"X"):
            found.append(int(pid))
    return found


def gone_or_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] == b"Z"


async def until(predicate: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_runs_in_the_workspace_and_reports_the_exit_code(sandbox: Sandbox) -> None:
    output = await sandbox.call("bash", command="pwd; echo oops >&2; exit 3")
    assert text(output) == f"{sandbox.workspace.resolve()}\noops\n[exit code 3]"
    assert output.structured["exit_code"] == 3 and not output.structured["timed_out"]


UNCONTAINED = dataclasses.replace(SETTINGS, sandbox=False)


async def test_the_shell_itself_is_reaped(sandbox: Sandbox) -> None:
    """Catalogue D8: a tool that never exits."""
    sandbox.settings = UNCONTAINED  # the pid it prints is a host pid only outside the sandbox
    output = await sandbox.call("bash", command="echo $$")
    assert not Path(f"/proc/{int(text(output))}").exists()


async def test_a_command_that_never_exits_is_killed_with_its_group(sandbox: Sandbox) -> None:
    """Catalogue D8: a tool that never exits."""
    mark = marker()
    started = time.monotonic()
    output = await sandbox.call(
        "bash", command=f"sleep 900.{mark} & sleep 900.{mark}; echo never", timeout=0.5
    )
    assert time.monotonic() - started < 0.5 + sandbox.settings.kill_grace + 1.5
    assert output.structured["timed_out"] and "never" not in text(output)
    assert "[killed: no exit within 0.5s; its process group was terminated]" in text(output)
    assert live(mark) == []


async def test_sigterm_ignored_means_sigkill_after_the_grace(sandbox: Sandbox) -> None:
    # Contained, the shell cannot ignore anything: its namespace dies with the sandbox.
    """Catalogue D8: a tool that never exits."""
    sandbox.settings = UNCONTAINED
    mark = marker()
    output = await sandbox.call(
        "bash", command=f"trap '' TERM; sleep 900.{mark} & sleep 900.{mark}", timeout=0.3
    )
    assert output.structured["exit_code"] == -9
    assert live(mark) == []


@pytest.mark.parametrize(
    "daemon",
    [
        "sleep 900.{m} > /dev/null 2>&1 & echo $!",
        "nohup sleep 900.{m} > /dev/null 2>&1 & echo $!",
        "set -m; sleep 900.{m} & echo $!",  # job control: a process group of its own
        "(sleep 900.{m} &) ; sleep 0.05; pgrep -f 900.{m}",  # orphaned at once
    ],
)
async def test_a_forked_daemon_does_not_outlive_the_call(sandbox: Sandbox, daemon: str) -> None:
    """Catalogue D8: a tool that never exits."""
    sandbox.settings = UNCONTAINED  # the process rules alone (the sandbox: test_sandbox.py)
    mark = marker()
    started = time.monotonic()
    output = await sandbox.call("bash", command=daemon.format(m=mark), timeout=30)
    assert time.monotonic() - started < 3
    assert output.structured["killed_background"] and not output.structured["timed_out"]
    assert "background processes it left running were killed" in text(output)
    assert live(mark) == []
    assert gone_or_zombie(int(text(output).splitlines()[0]))


async def test_a_flood_is_capped_and_killed_at_the_timeout(sandbox: Sandbox) -> None:
    """Catalogue D8: a tool that never exits."""
    mark = marker()
    output = await sandbox.call("bash", command=f"yes flood{mark}", timeout=0.5)
    body = text(output)
    assert len(body.encode()) < sandbox.settings.output_cap + 200
    assert body.startswith(f"flood{mark}\n") and "… [truncated: " in body
    assert output.structured["timed_out"]
    assert output.structured["output_bytes"] > sandbox.settings.output_cap
    assert output.structured["truncated_bytes"] >= output.structured["output_bytes"] - 4000
    assert live(f"flood{mark}") == []


async def started(sandbox: Sandbox, command: str, mark: str) -> asyncio.Task[ToolOutput]:
    """A running call, once both of its sleeps have started."""
    call = asyncio.create_task(sandbox.call("bash", command=command, timeout=60))
    try:
        await until(lambda: len(live(mark, b"sleep\0")) == 2)
    except BaseException:
        call.cancel()
        raise
    return call


@pytest.mark.parametrize("prefix", ["", "trap '' TERM; "])
async def test_cancellation_mid_command_kills_the_group(sandbox: Sandbox, prefix: str) -> None:
    mark = marker()
    call = await started(sandbox, f"{prefix}sleep 900.{mark} & sleep 900.{mark}", mark)
    begun = time.monotonic()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert time.monotonic() - begun < sandbox.settings.kill_grace + 1.5
    assert live(mark) == []
    assert process.running() == frozenset()


async def test_worker_shutdown_backstop_kills_running_groups(sandbox: Sandbox) -> None:
    """Catalogue C8: graceful shutdown."""
    mark = marker()
    call = await started(sandbox, f"sleep 900.{mark} & sleep 900.{mark}", mark)
    assert len(process.running()) == 1
    process.kill_running()
    output = await call
    assert output.structured["exit_code"] == -9
    assert live(mark) == []


async def test_a_timeout_above_the_cap_is_refused_naming_the_limit(sandbox: Sandbox) -> None:
    sandbox.settings = dataclasses.replace(sandbox.settings, bash_max_timeout=30)
    ran = sandbox.workspace / "ran"
    with pytest.raises(ToolFailure) as refused:
        await sandbox.call("bash", command=f"touch {ran}", timeout=30.5)
    assert str(refused.value).startswith(
        "timeout 30.5 s is above the limit of 30 s for one command, so the command did not run. "
        "Give a timeout of at most 30 s"
    )
    assert not ran.exists()
    output = await sandbox.call("bash", command=f"touch {ran}", timeout=30)
    assert output.structured["exit_code"] == 0 and ran.exists()


def test_the_schema_states_the_timeout_default_and_cap() -> None:
    settings = dataclasses.replace(SETTINGS, bash_timeout=45, bash_max_timeout=300)
    bash = builtin_registry(settings).get("bash")
    assert bash is not None
    timeout = bash.spec().input_schema["properties"]["timeout"]
    assert timeout["description"] == (
        "Seconds before the command is killed: 45 when not given, at most 300"
    )
    assert {"type": "number", "exclusiveMinimum": 0, "maximum": 300} in timeout["anyOf"]


async def test_a_nul_byte_in_the_command_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(ToolFailure, match="NUL"):
        await sandbox.call("bash", command="echo a\x00b")


async def test_progress_reports_output_as_it_comes(sandbox: Sandbox) -> None:
    await sandbox.call("bash", command="for i in 1 2 3 4 5 6; do echo tick$i; sleep 0.06; done")
    assert sandbox.progress, "no progress reported"
    structured, tail = sandbox.progress[-1]
    assert structured["output_bytes"] > 0 and "tick" in tail


async def test_the_engine_environment_is_hidden(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONFLOW_DATABASE_URL", "postgresql://user:hunter2@db/x")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-hunter2")
    monkeypatch.setenv("HARMLESS", "visible")
    body = text(await sandbox.call("bash", command="env"))
    assert "hunter2" not in body and "HARMLESS=visible" in body and "TERM=dumb" in body


async def test_changed_files_are_reported_without_protected_paths(sandbox: Sandbox) -> None:
    ws = sandbox.workspace
    (ws / "old.txt").write_text("old")
    (ws / "keep.txt").write_text("keep")
    (ws / "same.txt").write_text("same")
    (ws / ".git").mkdir()
    command = "echo a > new.txt; rm old.txt; echo b >> keep.txt; echo x > .git/HEAD; echo y > .env"
    output = await sandbox.call("bash", command=command)
    assert output.output_paths == ("keep.txt", "new.txt", "old.txt")
    assert output.structured["files_tracked"]


async def test_huge_workspaces_are_not_tracked(sandbox: Sandbox) -> None:
    sandbox.settings = dataclasses.replace(sandbox.settings, track_entries=3)
    for n in range(5):
        (sandbox.workspace / f"f{n}").write_text("x")
    output = await sandbox.call("bash", command="echo a > new.txt")
    assert output.output_paths == () and not output.structured["files_tracked"]


async def test_a_failing_progress_report_stops_the_command(sandbox: Sandbox) -> None:
    """Progress is recorded through the store; when that fails (a lost claim), the call fails
    at once and its group dies with it."""

    async def failing(structured: dict[str, object], text: str) -> None:
        raise RuntimeError("store unavailable")

    mark = marker()
    tool = sandbox.tool("bash")
    command = f"sleep 900.{mark} & while true; do echo tick; sleep 0.05; done"
    context = dataclasses.replace(sandbox.context(), progress=failing)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="store unavailable"):
        await tool.execute(tool.input_model(command=command, timeout=30), context)
    assert time.monotonic() - started < 3
    assert live(mark) == []
