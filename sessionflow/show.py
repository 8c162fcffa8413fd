"""``sessionflow show`` and ``sessions``: a transcript and session records for a terminal."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape

from sessionflow.watch import OUTPUT_LINES, clip, cut, output_text


class Transcript:
    """Prompts, answers, reasoning, tool calls with their input and (first lines of) output."""

    def __init__(self, console: Console, *, full: bool = False) -> None:
        self.console = console
        self.full = full

    def show(self, message: Any) -> None:
        if message.type == "user":
            self.console.print(f"[bold cyan]you[/] {escape(self._cut(message.text))}")
        elif message.type == "assistant":
            self._assistant(message)
        elif message.type == "compaction":
            summary = escape(self._cut(message.summary)) if message.summary else ""
            self.console.print(
                f"[yellow]compaction[/] [dim]{message.reason} · {message.status}[/] {summary}",
                highlight=False,
            )
        else:
            text = escape(self._cut(getattr(message, "text", "")))
            self.console.print(f"[dim]{message.type}[/] {text}", highlight=False)

    def _cut(self, text: str) -> str:
        return text if self.full else cut(text)

    def _assistant(self, message: Any) -> None:
        print_ = self.console.print
        print_(f"[bold magenta]assistant[/] [dim]{escape(str(message.model))}[/]", highlight=False)
        for part in message.content:
            if part.type == "text":
                print_(part.text, highlight=False, markup=False)
            elif part.type == "reasoning":
                print_(part.text, style="dim italic", highlight=False, markup=False)
            else:
                self._tool(part)
        if message.error:
            print_(f"[red]{escape(message.error.type)}: {escape(message.error.message)}[/]")

    def _tool(self, part: Any) -> None:
        state = part.state
        arguments = state.input if isinstance(state.input, dict) else {}
        summary = json.dumps(arguments, ensure_ascii=False)
        summary = summary if self.full or len(summary) <= 80 else summary[:77] + "..."
        colour = {"completed": "green", "error": "red"}.get(state.status, "yellow")
        self.console.print(
            f"[{colour}]tool {escape(part.name)}[/] [dim]{state.status} {escape(summary)}[/]",
            highlight=False,
        )
        if state.status == "error":
            self.console.print(f"  [red]{escape(state.error.message)}[/]", highlight=False)
        structured = getattr(state, "structured", None) or {}
        child = (structured.get("child") or {}).get("session_id") or structured.get("task_id")
        if child:  # a task call: where its subagent's own transcript is
            self.console.print(
                f"  [dim]subagent session {escape(child)}: sessionflow show {escape(child)}[/]",
                highlight=False,
            )
        content = [c.model_dump(mode="json") for c in getattr(state, "content", ())]
        shown, hidden = clip(output_text({"content": content}), None if self.full else OUTPUT_LINES)
        for line in shown:
            self.console.print(f"[dim]  │ {escape(line)}[/]", highlight=False)
        if hidden:
            self.console.print(f"[dim]  │ … {hidden} more line(s); --full shows all[/]")


def session_json(info: Any) -> dict[str, Any]:
    value = asdict(info)
    value["model"] = str(info.model) if info.model else None
    value["tokens"] = info.tokens.model_dump()
    value["spend"] = info.spend.model_dump(mode="json")
    value["budget"] = info.budget.model_dump(mode="json") if info.budget else None
    return value
