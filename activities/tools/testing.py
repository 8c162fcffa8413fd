"""Small tools for tests and demos: ``echo``, ``sleep``, ``fail``, ``defect``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput, ToolRegistry


class EchoInput(BaseModel):
    text: str = ""


class Echo(Tool[EchoInput]):
    name = "echo"
    description = "Return the given text."
    input_model = EchoInput
    retry_safe = True

    async def execute(self, input: EchoInput, context: ToolContext) -> ToolOutput:
        return ToolOutput.text(input.text, text=input.text)


class SleepInput(BaseModel):
    seconds: float = Field(default=0.0, ge=0, le=3600)
    until_file: str | None = Field(default=None, description="wait until this file exists")
    text: str = ""


class Sleep(Tool[SleepInput]):
    name = "sleep"
    description = "Wait for a number of seconds (or until a file exists), then return the text."
    input_model = SleepInput
    retry_safe = False

    async def execute(self, input: SleepInput, context: ToolContext) -> ToolOutput:
        if input.until_file:
            while not Path(input.until_file).exists():
                await asyncio.sleep(0.02)
        await asyncio.sleep(input.seconds)
        return ToolOutput.text(input.text or "slept", slept=input.seconds)


class FailInput(BaseModel):
    message: str = "Tool failed"


class Fail(Tool[FailInput]):
    name = "fail"
    description = "Fail with the given message."
    input_model = FailInput
    retry_safe = True

    async def execute(self, input: FailInput, context: ToolContext) -> ToolOutput:
        raise ToolFailure(input.message)


class Defect(Tool[FailInput]):
    name = "defect"
    description = "Crash with an unexpected error."
    input_model = FailInput
    retry_safe = True

    async def execute(self, input: FailInput, context: ToolContext) -> ToolOutput:
        raise RuntimeError("unexpected tool defect")


def testing_registry() -> ToolRegistry:
    return ToolRegistry([Echo(), Sleep(), Fail(), Defect()])
