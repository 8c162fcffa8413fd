"""The tool interface and registry used by the ``run_tool`` activity.

A tool has a name, a description, a pydantic input model (its JSON schema is what the model sees),
a ``retry_safe`` flag, and an async ``execute(input, context)``. Failures the model should read
raise ``ToolFailure``; anything else is a defect that the model also reads as an error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from activities.providers.base import ToolSpec
from sessionflow.models.common import ContentPart, TextContent
from sessionflow.models.events import Event, Todo
from sessionflow.models.permissions import Action

InputT = TypeVar("InputT", bound=BaseModel)


class ToolFailure(Exception):
    """A failure the model should read and react to (bad input, a denied path, ...)."""


class PermissionRejected(ToolFailure):
    """A tool's own refusal on permission grounds: the step fails and the drain with it
    (``permission.rejected``, reference §4.5.1), unlike a policy ``deny`` the model reads."""


@dataclass(frozen=True)
class ToolContext:
    session_id: str
    workspace: Path
    assistant_message_id: str
    call_id: str
    progress: Callable[[dict[str, Any], str], Awaitable[None]]
    # The session's ``network`` setting: whether ``bash`` may reach the network.
    network: bool = False
    # The user's answer, for a tool that asks one (``Tool.asks_user``).
    answer: str | None = None
    # The session's todo list as the store holds it (``todoread``).
    todos: Callable[[], Awaitable[tuple[Todo, ...]]] | None = None

    @property
    def idempotency_key(self) -> str:
        return f"{self.session_id}/{self.assistant_message_id}/{self.call_id}"


@dataclass(frozen=True)
class ToolOutput:
    structured: dict[str, Any] = field(default_factory=dict)
    content: tuple[ContentPart, ...] = ()
    output_paths: tuple[str, ...] = ()
    # The whole normalized text when ``content`` had to be cut for the model (store only).
    full_text: str | None = None
    # Events of the session written with the call's result, in its settlement's transaction.
    events: tuple[Event, ...] = ()
    # For a tool that found its changes by comparing snapshots (``bash``): each changed
    # path's metadata before the call, (mode, size, mtime ns, inode), None where it was absent.
    seen_before: dict[str, tuple[int, int, int, int] | None] | None = None

    @classmethod
    def text(cls, body: str, **structured: Any) -> ToolOutput:
        return cls(structured=structured, content=(TextContent(text=body),))


class Tool(Generic[InputT]):
    name: ClassVar[str]
    description: str  # a class attribute, or set by a tool whose text depends on settings
    input_model: ClassVar[type[BaseModel]]
    retry_safe: ClassVar[bool] = False
    # The policy's action for a call no rule matches (``activities/permissions.py``).
    permission: ClassVar[Action] = "allow"
    # The tool asks the user something and waits for the answer (``question``).
    asks_user: ClassVar[bool] = False

    async def execute(self, input: InputT, context: ToolContext) -> ToolOutput:
        raise ToolFailure(f"Tool {self.name} cannot run")

    def may_change_files(self) -> bool:
        """Whether a call may change the workspace (the journal records what it changed): any
        tool that is not retry-safe, which a read-only one is."""
        return not self.retry_safe

    def touches(self, input: InputT) -> tuple[str, ...]:
        """The workspace paths a call may change, as given, known before it runs: the
        journal reads what they hold first (``activities/journal.py``)."""
        return ()

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema the model sees; a tool whose limits are settings states them here."""
        return self.input_model.model_json_schema()

    def spec(self) -> ToolSpec:
        # Built once per tool: generating a JSON schema costs more than the rest of a request.
        cached: ToolSpec | None = getattr(self, "_spec", None)
        if cached is None:
            cached = ToolSpec(
                name=self.name, description=self.description, input_schema=self.input_schema()
            )
            self._spec = cached
        return cached


class ToolRegistry:
    """Tools by name, each with where it came from (``built-in``, a plugin entry, an MCP
    server), as ``sessionflow tools`` shows it."""

    def __init__(self, tools: Iterable[Tool[Any]] = (), *, origin: str = "built-in") -> None:
        self._tools: dict[str, Tool[Any]] = {}
        self._origins: dict[str, str] = {}
        for tool in tools:
            self.register(tool, origin=origin)

    def register(self, tool: Tool[Any], *, origin: str = "built-in") -> None:
        self._tools[tool.name] = tool
        self._origins[tool.name] = origin

    def origin(self, name: str) -> str | None:
        return self._origins.get(name)

    def merged(self, tools: Iterable[tuple[str, Tool[Any]]]) -> ToolRegistry:
        """A registry of these tools and ``tools`` (origin, tool) after them."""
        merged = ToolRegistry()
        merged._tools, merged._origins = dict(self._tools), dict(self._origins)
        for origin, tool in tools:
            merged.register(tool, origin=origin)
        return merged

    def get(self, name: str) -> Tool[Any] | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def tools(self) -> list[Tool[Any]]:
        return list(self._tools.values())

    def specs(self) -> list[ToolSpec]:
        return [tool.spec() for tool in self._tools.values()]
