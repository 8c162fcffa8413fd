"""The built-in coding tools as registries.

``builtin_registry`` (also ``default_registry``, what a production worker runs) holds read,
write, edit, apply_patch, list, glob, grep, bash, question, todowrite and todoread; the test
tools (echo, sleep, fail, defect) stay in ``testing.testing_registry``.
"""

from __future__ import annotations

from typing import Any

from activities.tools.apply_patch import ApplyPatch
from activities.tools.base import Tool, ToolRegistry
from activities.tools.bash import Bash
from activities.tools.files import Edit, Read, Write
from activities.tools.question import Question
from activities.tools.search import GlobTool, Grep, ListTool
from activities.tools.settings import ToolSettings
from activities.tools.todo import TodoRead, TodoWrite


def builtin_tools(settings: ToolSettings | None = None) -> list[Tool[Any]]:
    settings = settings or ToolSettings()
    return [
        Read(settings),
        Write(settings),
        Edit(settings),
        ApplyPatch(settings),
        ListTool(settings),
        GlobTool(settings),
        Grep(settings),
        Bash(settings),
        Question(),
        TodoWrite(),
        TodoRead(),
    ]


def builtin_registry(settings: ToolSettings | None = None) -> ToolRegistry:
    return ToolRegistry(builtin_tools(settings))


def default_registry(settings: ToolSettings | None = None) -> ToolRegistry:
    """What a production worker runs: the built-ins only."""
    return builtin_registry(settings)
