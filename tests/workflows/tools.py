"""Tools for drain tests: a gate that counts concurrent executions."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel

from activities.tools.base import (
    PermissionRejected,
    Tool,
    ToolContext,
    ToolOutput,
    ToolRegistry,
)
from activities.tools.builtin import builtin_tools
from activities.tools.settings import ToolSettings
from activities.tools.testing import Defect, Echo, Fail, Sleep


class GateInput(BaseModel):
    text: str = ""
    gate: str | None = None
    progress: str | None = None  # reported as the call's progress before it waits


class Gate(Tool[GateInput]):
    """Waits until its gate file exists; records how many gates run at once."""

    name = "gate"
    description = "Wait for a gate file, then return the text."
    input_model = GateInput
    retry_safe = True

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.started: list[str] = []

    async def execute(self, input: GateInput, context: ToolContext) -> ToolOutput:
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.started.append(input.text)
        try:
            if input.progress is not None:
                await context.progress({"waiting": True}, input.progress)
            while input.gate and not Path(input.gate).exists():
                await asyncio.sleep(0.02)
            return ToolOutput.text(input.text, text=input.text)
        finally:
            self.active -= 1


class Refuse(Tool[GateInput]):
    """Refuses on permission grounds of its own (reference #64)."""

    name = "refuse"
    description = "Always refuses."
    input_model = GateInput

    async def execute(self, input: GateInput, context: ToolContext) -> ToolOutput:
        raise PermissionRejected(f"Permission denied: {input.text or 'edit'}")


class CrashInput(BaseModel):
    log: str


class Crash(Tool[CrashInput]):
    """Kills the worker process running it (a poison input, catalogue C9), after noting the
    attempt in ``log``. Retry-safe, so Temporal tries it again on another worker."""

    name = "crash"
    description = "Kill the worker."
    input_model = CrashInput
    retry_safe = True

    async def execute(self, input: CrashInput, context: ToolContext) -> ToolOutput:
        await asyncio.to_thread(_note, Path(input.log), f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


class StallInput(BaseModel):
    seconds: float


class Stall(Tool[StallInput]):
    """Blocks its worker's event loop (a synchronous sleep, as a CPU hog or a blocking call
    does): nothing else in that process runs meanwhile, claim renewals included (catalogue F4)."""

    name = "stall"
    description = "Block the event loop."
    input_model = StallInput
    retry_safe = False

    async def execute(self, input: StallInput, context: ToolContext) -> ToolOutput:
        time.sleep(input.seconds)  # noqa: ASYNC251 -- blocking the loop is this tool's point
        return ToolOutput.text(f"stalled {input.seconds} s")


def _note(path: Path, line: str) -> None:
    with path.open("a") as log:
        log.write(line)


def registry(gate: Gate) -> ToolRegistry:
    """The built-ins, the test tools, and this test's gate. ``SESSIONFLOW_SANDBOX=off`` (for a
    worker process) runs bash unconfined, as a worker would."""
    settings = ToolSettings(sandbox=os.environ.get("SESSIONFLOW_SANDBOX", "on") != "off")
    tests = [Echo(), Sleep(), Fail(), Defect(), Refuse(), Crash(), Stall(), gate]
    return ToolRegistry([*builtin_tools(settings), *tests])
