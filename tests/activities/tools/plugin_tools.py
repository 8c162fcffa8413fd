"""Tools of a user's own, for the plugin loading tests: each attribute is one kind of entry."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sessionflow.tools import Tool, ToolContext, ToolOutput


class RunTestsInput(BaseModel):
    target: str = "tests"


class RunTests(Tool[RunTestsInput]):
    name = "run_tests"
    description = "Run the test suite."
    input_model = RunTestsInput

    async def execute(self, input: RunTestsInput, context: ToolContext) -> ToolOutput:
        return ToolOutput.text(f"ran {input.target} in {context.workspace.name}")


class Lint(RunTests):
    name = "lint"
    description = "Lint the code."
    retry_safe = True


run_tests = RunTests()
both = [RunTests(), Lint()]


def factory() -> list[Tool[Any]]:
    return [Lint()]


not_a_tool = object()


def broken_factory() -> Tool[Any]:
    raise RuntimeError("no config")


class Clashing(RunTests):
    name = "read"


class BadName(RunTests):
    name = "run tests"


class NotAnObject(RunTests):
    name = "weird"

    def input_schema(self) -> dict[str, Any]:
        return {"type": "string"}
