"""Chat Completions stream chunks to normalized events.

Text arrives as ``delta.content``; reasoning as ``delta.reasoning_content`` (DeepSeek, vLLM) or
``delta.reasoning`` (Ollama, OpenRouter); tool calls as indexed deltas whose first piece carries
the id and name, later pieces only argument text. A call is made when the choice finishes, never
before: its arguments are complete only then. Usage arrives in a last chunk without choices
(``stream_options.include_usage``). Only choice 0 is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from activities.providers import base as p
from activities.providers import fields as f
from activities.providers.assembly import Fragments, Notes, ToolCalls
from activities.providers.errors import Label

_FINISH = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
}


@dataclass
class _Pending:
    """A tool call seen before its name: some servers send the name after the first piece."""

    call_id: str | None = None
    arguments: str = ""


class ChatParser:
    def __init__(self, label: Label) -> None:
        self.notes = Notes(label)
        self.fragments = Fragments(self.notes)
        self.tools = ToolCalls(self.notes)
        self.usage = p.Usage()
        self.finish: str | None = None
        self._pending: dict[int, _Pending] = {}

    @property
    def complete(self) -> bool:
        return self.finish is not None

    def feed(self, chunk: dict[str, Any]) -> list[p.StreamEvent]:
        usage = f.obj(chunk, "usage")
        if usage:
            self.usage = _usage(usage)
        events: list[p.StreamEvent] = []
        for choice in f.items(chunk, "choices"):
            if isinstance(choice, dict) and (f.count(choice, "index") or 0) == 0:
                events += self._choice(choice)
        return events

    def end(self) -> list[p.StreamEvent]:
        if self.finish is None:
            raise self.notes.label.error(
                "transport", "the stream ended before the response finished"
            )
        reason = self.finish
        if reason == "stop" and self.tools.local_called:
            reason = "tool-calls"  # some compatible servers say "stop" after tool calls
        return [p.StepFinish(reason=reason, usage=self.usage)]

    def _choice(self, choice: dict[str, Any]) -> list[p.StreamEvent]:
        if self.finish is not None:
            self.notes("content after the finish reason")
            return []
        delta = f.obj(choice, "delta")
        events = self._reasoning(delta) + self._content(delta)
        for call in f.items(delta, "tool_calls"):
            if isinstance(call, dict):
                events += self._tool_delta(call)
        reason = f.text(choice, "finish_reason")
        if reason is not None:
            events += self._finish(reason)
        return events

    def _reasoning(self, delta: dict[str, Any]) -> list[p.StreamEvent]:
        piece = f.text(delta, "reasoning_content") or f.text(delta, "reasoning")
        if not piece:
            return []
        return self.fragments.ensure("reasoning", 0) + self.fragments.delta("reasoning", 0, piece)

    def _content(self, delta: dict[str, Any]) -> list[p.StreamEvent]:
        piece = f.text(delta, "content")
        if not piece:
            return []
        # Answer text after reasoning means the reasoning is over.
        events = (
            self.fragments.end("reasoning", 0) if self.fragments.is_open("reasoning", 0) else []
        )
        return events + self.fragments.ensure("text", 0) + self.fragments.delta("text", 0, piece)

    def _tool_delta(self, call: dict[str, Any]) -> list[p.StreamEvent]:
        index = f.count(call, "index") or 0
        function = f.obj(call, "function")
        piece = f.text(function, "arguments") or ""
        if self.tools.is_open(index):
            return self.tools.delta(index, piece)
        pending = self._pending.setdefault(index, _Pending())
        pending.call_id = pending.call_id or f.text(call, "id")
        pending.arguments += piece
        name = f.text(function, "name")
        if not name:
            return []
        del self._pending[index]
        # Servers that send no ids (older Ollama) still get one call per index.
        call_id = pending.call_id or f"call_{index}"
        return self.tools.start(index, call_id, name) + self.tools.delta(index, pending.arguments)

    def _finish(self, reason: str) -> list[p.StreamEvent]:
        self.finish = _FINISH.get(reason, "other")
        if self._pending:
            self.notes("tool calls that never named their tool", sorted(self._pending))
        return self.fragments.close_all() + self.tools.finish_all()


def _usage(usage: dict[str, Any]) -> p.Usage:
    prompt = f.obj(usage, "prompt_tokens_details")
    completion = f.obj(usage, "completion_tokens_details")
    return p.Usage(
        input=f.count(usage, "prompt_tokens") or 0,
        output=f.count(usage, "completion_tokens") or 0,
        reasoning=f.count(completion, "reasoning_tokens") or 0,
        cache_read=f.count(prompt, "cached_tokens") or 0,
    )
