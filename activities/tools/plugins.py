"""Tools from elsewhere, as a worker loads them at start: ``SESSIONFLOW_TOOLS`` entries and the
``sessionflow.tools`` entry points.

An entry names a tool, a list of tools, a ``Tool`` subclass (built with no arguments) or a
factory returning either, as ``module:attribute`` (``attribute`` may be dotted). Everything it
yields is checked before the worker polls anything: a tool's name is what providers accept
(``^[A-Za-z0-9_-]{1,64}$``) and unique among every loaded tool, its description is text, and its
input schema is a JSON schema of an object. A bad entry stops the worker with one line naming
the entry and what is wrong (``PluginError``); nothing half-loaded ever serves a session.

A plugin tool is not retry-safe unless it says so (``Tool.retry_safe``): a retried attempt that
may already have run it then settles as outcome-unknown instead of running it twice.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from activities.tools.base import Tool, ToolRegistry

ENTRY_POINT_GROUP = "sessionflow.tools"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class PluginError(ValueError):
    """A tool entry that cannot be loaded; the message names the entry and the fault."""


def load_entry(entry: str) -> list[Tool[Any]]:
    """The tools ``entry`` (``module:attribute``) names, checked one by one."""
    module_name, colon, attribute = entry.partition(":")
    if not colon or not module_name or not attribute:
        raise PluginError(f"tool entry {entry!r}: expected module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # an import runs the module: anything may go wrong there
        raise PluginError(f"tool entry {entry!r}: cannot import {module_name}: {error}") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PluginError(f"tool entry {entry!r}: {module_name} has no attribute {attribute}")
        target = getattr(target, part)
    return [_checked(entry, tool) for tool in _tools_of(entry, target)]


def entry_point_tools() -> list[tuple[str, Tool[Any]]]:
    """The tools of every installed ``sessionflow.tools`` entry point, with their origins."""
    loaded: list[tuple[str, Tool[Any]]] = []
    for point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        origin = f"entry point {point.name} ({point.value})"
        try:
            target = point.load()
        except Exception as error:
            raise PluginError(f"tool {origin}: cannot load: {error}") from None
        loaded += [(origin, _checked(origin, tool)) for tool in _tools_of(origin, target)]
    return loaded


def register_all(registry: ToolRegistry, tools: Iterable[tuple[str, Tool[Any]]]) -> ToolRegistry:
    """Add each (origin, tool) to ``registry``, refusing a name some other tool already has."""
    for origin, tool in tools:
        clash = registry.origin(tool.name)
        if clash is not None:
            raise PluginError(f"tool {tool.name!r} from {origin}: the name is taken by {clash}")
        registry.register(tool, origin=origin)
    return registry


def _tools_of(entry: str, target: Any) -> list[Any]:
    if isinstance(target, type) and issubclass(target, Tool):
        try:
            return [target()]
        except Exception as error:
            raise PluginError(
                f"tool entry {entry!r}: {target.__name__}() failed: {error}"
            ) from None
    if isinstance(target, Tool):
        return [target]
    if isinstance(target, list | tuple):
        return list(target)
    if callable(target):
        made = _call(entry, target)
        return list(made) if isinstance(made, list | tuple) else [made]
    return [target]


def _call(entry: str, factory: Callable[[], Any]) -> Any:
    try:
        return factory()
    except Exception as error:
        raise PluginError(f"tool entry {entry!r}: its factory failed: {error}") from None


def _checked(entry: str, tool: Any) -> Tool[Any]:
    if not isinstance(tool, Tool):
        raise PluginError(
            f"tool entry {entry!r}: {tool!r} is not a tool (subclass sessionflow.tools.Tool)"
        )
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PluginError(f"tool entry {entry!r}: name {name!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
    if not isinstance(getattr(tool, "description", None), str):
        raise PluginError(f"tool entry {entry!r}: tool {name!r} has no description text")
    model = getattr(tool, "input_model", None)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise PluginError(f"tool entry {entry!r}: tool {name!r} needs an input_model (pydantic)")
    try:
        schema = tool.input_schema()
    except Exception as error:
        raise PluginError(
            f"tool entry {entry!r}: tool {name!r} has an invalid input schema: {error}"
        ) from None
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise PluginError(
            f"tool entry {entry!r}: tool {name!r}'s input schema must describe an object"
        )
    return tool
