"""Tools as another host's worker offers them: definitions a turn advertises to the model,
for calls that run on that host (``activities/hosts.py`` records them in its lease)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from activities.tools.base import Tool, ToolFailure, ToolRegistry


def catalog(tools: ToolRegistry) -> list[dict[str, Any]]:
    """What a host's worker offers, as turns elsewhere advertise it to the model."""
    return [
        {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema(),
            "retry_safe": tool.retry_safe,
            "permission": tool.permission,
            "origin": tools.origin(tool.name) or "built-in",
        }
        for tool in tools.tools()
    ]


class _AnyInput(BaseModel):
    model_config = ConfigDict(extra="allow")


class OfferedTool(Tool[_AnyInput]):
    """A tool another host's worker offers: its definition only (it runs on that host)."""

    input_model: ClassVar[type[BaseModel]] = _AnyInput

    def __init__(self, offered: dict[str, Any]) -> None:
        self.name = str(offered["name"])  # type: ignore[misc]
        self.description = str(offered.get("description") or self.name)
        self.retry_safe = bool(offered.get("retry_safe"))  # type: ignore[misc]
        self.permission = offered.get("permission") or "allow"  # type: ignore[misc]
        self._schema = dict(offered.get("input_schema") or {"type": "object"})

    def input_schema(self) -> dict[str, Any]:
        return self._schema

    async def execute(self, input: _AnyInput, context: Any) -> Any:
        raise ToolFailure(f"{self.name} runs on its host's workers, not here")


def offered_tools(offered: list[dict[str, Any]]) -> ToolRegistry:
    registry = ToolRegistry()
    for entry in offered:
        if isinstance(entry, dict) and entry.get("name"):
            registry.register(OfferedTool(entry), origin=str(entry.get("origin") or "built-in"))
    return registry
