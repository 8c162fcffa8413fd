"""The tool API, for tools of your own: the stable import path of what a tool is made of.

A tool is a ``Tool`` subclass with a ``name``, a ``description``, a pydantic ``input_model``
(its JSON schema is what the model sees) and an async ``execute(input, context)`` returning a
``ToolOutput``. Raise ``ToolFailure`` for a failure the model should read. Say
``retry_safe = True`` only when running the call twice does no harm: otherwise a retried
attempt that may already have run it settles as outcome-unknown rather than run it again.
``permission`` is what the policy does with a call no rule matches (``allow``, ``ask``,
``deny``).

Load it with ``SESSIONFLOW_TOOLS=builtin,my_package.tools:run_tests`` (a tool, a list of
tools, a ``Tool`` subclass or a factory returning either) or the ``sessionflow.tools`` entry
point group of your package.
"""

from __future__ import annotations

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.plugins import ENTRY_POINT_GROUP, PluginError
from sessionflow.models.common import ContentPart, TextContent

__all__ = [
    "ENTRY_POINT_GROUP",
    "ContentPart",
    "PluginError",
    "TextContent",
    "Tool",
    "ToolContext",
    "ToolFailure",
    "ToolOutput",
]
