"""``bash``: one shell command in the workspace, in its own process group, with a timeout.

The command's group dies with its call: at the timeout, when the call is cancelled (an interrupt,
a lost claim, worker shutdown) and when the shell exits leaving background jobs behind (a command
cannot outlive its call; ``sleep 1000 &`` is killed). SIGTERM first, SIGKILL after a grace period
(``process.kill_group``); the shell itself is always awaited, so it never stays a zombie.

Output (stdout and stderr, merged) is read as it comes so a flood cannot block the command; the
first ``output_cap`` bytes are kept and the rest only counted. Files the command changed are
found by snapshotting the workspace around it (``changes.py``, protected paths skipped) and
returned as ``output_paths``.

The command runs in the shell sandbox (``sandbox.py``): the host read-only, the workspace
read-write, protected paths masked, no network unless the session allows it, and a PID
namespace that ends with the shell, so nothing it started outlives the call. It does not see
the engine's own environment variables (``ToolSettings.hidden_env``) either. With the sandbox
off (``SESSIONFLOW_SANDBOX=off``) only the process-group rules above hold.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from pydantic import BaseModel, Field

from activities.tools import process
from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.changes import changed, snapshot
from activities.tools.output import normalize, text_output
from activities.tools.paths import Workspace
from activities.tools.sandbox import Sandbox
from activities.tools.settings import ToolSettings

_CHUNK = 65536
_PROGRESS_TAIL = 2000
# Once the group is dead its output pipe drains at once, unless a process that left the
# session (setsid) still holds it; we stop reading then.
_DRAIN_SECONDS = 1.0
_QUIET_ENV = {
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
}


@dataclass
class Run:
    """What a command did; ``output`` holds at most the capture limit."""

    capture: int
    output: bytearray = field(default_factory=bytearray)
    total: int = 0
    exit_code: int | None = None
    timed_out: bool = False
    killed_background: bool = False
    started: float = field(default_factory=time.monotonic)

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.capture - len(self.output)
        if room > 0:
            self.output += chunk[:room]


OnOutput = Callable[[Run, bytes], Awaitable[None]]


async def _read(stream: asyncio.StreamReader, run: Run, on_output: OnOutput) -> None:
    while chunk := await stream.read(_CHUNK):
        run.add(chunk)
        await on_output(run, chunk)
        await asyncio.sleep(0)  # a flood must not starve the timeout and the heartbeats


async def _stop(proc: asyncio.subprocess.Process, grace: float) -> None:
    await process.kill_group(proc.pid, grace)
    await proc.wait()


async def _stop_shielded(proc: asyncio.subprocess.Process, grace: float) -> None:
    """Kill and reap even while being cancelled; a second cancel gets SIGKILL at once."""
    stopping = asyncio.ensure_future(_stop(proc, grace))
    try:
        await asyncio.shield(stopping)
    except asyncio.CancelledError:
        process.signal_all(proc.pid, signal.SIGKILL)
        raise


async def _open_pipe() -> tuple[asyncio.StreamReader, asyncio.BaseTransport, int]:
    """Our own pipe for the command's output, so that waiting for the shell never waits for
    every holder of its stdout to close it (asyncio's ``wait`` does, with ``PIPE``)."""
    read_end, write_end = os.pipe()
    reader = asyncio.StreamReader(limit=_CHUNK * 4)
    loop = asyncio.get_running_loop()
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_end, "rb", buffering=0)
        )
    except BaseException:
        os.close(write_end)
        raise
    return reader, transport, write_end


async def _exited(
    proc: asyncio.subprocess.Process, reader: asyncio.Task[None], limit: float
) -> bool:
    """Wait for the shell to exit; False if it did not within ``limit``. A failed progress
    report (the reader's error) is raised at once, and the caller then kills the group."""
    waiter = asyncio.ensure_future(proc.wait())
    deadline = time.monotonic() + limit
    pending: set[asyncio.Future[Any]] = {waiter, reader}
    try:
        while waiter in pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            done, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if reader in done:
                reader.result()
        return True
    finally:
        waiter.cancel()


async def _supervise(
    proc: asyncio.subprocess.Process,
    stream: asyncio.StreamReader,
    run: Run,
    limit: float,
    grace: float,
    on_output: OnOutput,
    contained: bool,
) -> None:
    reader = asyncio.create_task(_read(stream, run, on_output))
    try:
        run.timed_out = not await _exited(proc, reader, limit)
        # A contained command's PID namespace ends with its shell, taking everything along
        # (its last processes may still be dying here: that is no background job).
        run.killed_background = not contained and not run.timed_out and process.alive(proc.pid)
        await _stop(proc, grace)
        run.exit_code = proc.returncode
        await asyncio.wait([reader], timeout=_DRAIN_SECONDS)
    finally:
        reader.cancel()
        if reader.done() and not reader.cancelled():
            reader.exception()  # a report failing after the command ended changes nothing


async def run_command(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    time_limit: float,
    capture: int,
    grace: float,
    on_output: OnOutput,
    contained: bool = False,
) -> Run:
    stream, transport, write_end = await _open_pipe()
    token = process.intend()  # recorded before it starts: a worker may die in between
    try:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env={**env, process.TOKEN_VARIABLE: token},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                start_new_session=True,
            )
        except BaseException:
            process.abandon(token)
            raise
        finally:
            os.close(write_end)
        run = Run(capture)
        return await _supervised(proc, stream, run, time_limit, grace, on_output, token, contained)
    finally:
        transport.close()


async def _supervised(
    proc: asyncio.subprocess.Process,
    stream: asyncio.StreamReader,
    run: Run,
    limit: float,
    grace: float,
    on_output: OnOutput,
    token: str,
    contained: bool,
) -> Run:
    process.track(proc.pid, token)
    try:
        await _supervise(proc, stream, run, limit, grace, on_output, contained)
    except BaseException:
        await _stop_shielded(proc, grace)
        raise
    finally:
        process.untrack(proc.pid)
    return run


def command_env(hidden: tuple[str, ...]) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not any(fnmatchcase(name, pattern) for pattern in hidden)
    }
    return env | _QUIET_ENV


class BashInput(BaseModel):
    command: str = Field(min_length=1, description="Shell command, run with bash -c")
    # The default and the cap are settings: ``Bash.input_schema`` states them to the model.
    timeout: float | None = Field(default=None, gt=0)
    description: str = Field(default="", description="What the command does, in a few words")


class Bash(Tool[BashInput]):
    name = "bash"
    description = (
        "Run a shell command in the workspace directory. stdout and stderr are merged and "
        "capped. The command and everything it started are killed at the timeout; background "
        "processes do not outlive the call."
    )
    input_model = BashInput
    retry_safe = False
    permission = "ask"

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()
        self.sandbox = Sandbox(self.settings)

    def input_schema(self) -> dict[str, Any]:
        schema = super().input_schema()
        timeout = schema["properties"]["timeout"]
        cap = self.settings.bash_max_timeout
        default = min(self.settings.bash_timeout, cap)
        timeout["description"] = (
            f"Seconds before the command is killed: {default:g} when not given, at most {cap:g}"
        )
        for choice in timeout["anyOf"]:
            if choice.get("type") == "number":
                choice["maximum"] = cap
        return schema

    async def execute(self, input: BashInput, context: ToolContext) -> ToolOutput:
        if "\0" in input.command:
            raise ToolFailure("The command contains a NUL byte")
        s = self.settings
        timeout = self._timeout(input)
        root = str(context.workspace)
        cwd = await asyncio.to_thread(_real_root, root, s)
        argv = await self._sandbox().wrap(
            [s.shell, "-c", input.command], root=cwd, cwd=cwd, network=context.network
        )
        before = await asyncio.to_thread(snapshot, root, s)
        run = await run_command(
            argv,
            cwd=cwd,
            env=command_env(s.hidden_env),
            time_limit=timeout,
            capture=max(s.output_cap, s.store_cap),
            grace=s.kill_grace,
            on_output=self._progress(context),
            contained=s.sandbox,
        )
        after = await asyncio.to_thread(snapshot, root, s) if before is not None else None
        paths = changed(before, after) if before is not None and after is not None else ()
        output = self._render(run, timeout, paths, tracked=after is not None)
        if before is None:
            return output
        return replace(output, seen_before={path: before.get(path) for path in paths})

    def _sandbox(self) -> Sandbox:
        if self.sandbox.settings is not self.settings:  # settings replaced (tests)
            self.sandbox = Sandbox(self.settings)
        return self.sandbox

    def _timeout(self, input: BashInput) -> float:
        """The command's time limit; asking for more than the cap is refused, not cut short."""
        cap = self.settings.bash_max_timeout
        if input.timeout is None:
            return min(self.settings.bash_timeout, cap)
        if input.timeout > cap:
            raise ToolFailure(
                f"timeout {input.timeout:g} s is above the limit of {cap:g} s for one command, "
                f"so the command did not run. Give a timeout of at most {cap:g} s; for longer "
                f"work, split it into commands that each finish within {cap:g} s (background "
                f"processes do not outlive the call)."
            )
        return input.timeout

    def _progress(self, context: ToolContext) -> OnOutput:
        last = time.monotonic()

        async def report(run: Run, chunk: bytes) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last < self.settings.progress_interval:
                return
            last = now
            elapsed = round(now - run.started, 3)
            tail = normalize(chunk[-_PROGRESS_TAIL:])
            await context.progress({"output_bytes": run.total, "elapsed_s": elapsed}, tail)

        return report

    def _render(
        self, run: Run, timeout: float, paths: tuple[str, ...], *, tracked: bool
    ) -> ToolOutput:
        return text_output(
            bytes(run.output) if run.output else b"(no output)",
            self.settings.output_cap,
            omitted=run.total - len(run.output),
            store_cap=self.settings.store_cap,
            suffix=_notes(run, timeout),
            paths=paths,
            exit_code=run.exit_code,
            timed_out=run.timed_out,
            killed_background=run.killed_background,
            output_bytes=run.total,
            files_tracked=tracked,
        )


def _notes(run: Run, timeout: float) -> str:
    notes = []
    if run.timed_out:
        notes.append(f"killed: no exit within {timeout:g}s; its process group was terminated")
    elif run.exit_code:
        notes.append(f"exit code {run.exit_code}")
    if run.killed_background:
        notes.append("background processes it left running were killed")
    return "\n[" + "; ".join(notes) + "]" if notes else ""


def _real_root(root: str, settings: ToolSettings) -> str:
    with Workspace(root, settings) as workspace:
        return workspace.real
