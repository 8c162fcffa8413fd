"""Local tools: the interface, the registry, and the tools themselves."""

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput, ToolRegistry

__all__ = ["Tool", "ToolContext", "ToolFailure", "ToolOutput", "ToolRegistry"]
