"""Anthropic Messages stream events to normalized events.

Content blocks open (``content_block_start``), stream deltas and close (``content_block_stop``)
by index: ``text``; ``thinking`` (text, then a ``signature_delta`` kept as replay metadata
``{signature}``); ``redacted_thinking`` (opaque ``{redactedData}``, no text); ``tool_use`` and
``server_tool_use`` (input as ``input_json_delta`` pieces; the call is made when the block
closes); and a server tool's result block (``web_search_tool_result`` and the like, complete in
its start event, kept with ``{blockType}``). ``message_delta`` carries the stop reason and usage;
``message_stop`` ends the message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.providers import base as p
from activities.providers import fields as f
from activities.providers.assembly import FragmentKind, Fragments, Notes, ToolCalls
from activities.providers.errors import Label, error_from_body

_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
}
_USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


class AnthropicParser:
    def __init__(self, label: Label) -> None:
        self.notes = Notes(label)
        self.fragments = Fragments(self.notes)
        self.tools = ToolCalls(self.notes)
        self.stop_reason: str | None = None
        self.stopped = False
        self._usage: dict[str, int] = {}
        self._blocks: dict[int, str] = {}  # open block index -> block type
        self._signatures: dict[int, str] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], list[p.StreamEvent]]] = {
            "message_start": self._message_start,
            "content_block_start": self._block_start,
            "content_block_delta": self._block_delta,
            "content_block_stop": self._block_stop,
            "message_delta": self._message_delta,
            "message_stop": self._message_stop,
            "error": self._error,
        }

    @property
    def complete(self) -> bool:
        # After the stop reason nothing but usage and the end marker is left to arrive.
        return self.stopped or (self.stop_reason is not None and not self._blocks)

    def feed(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        kind = f.text(event, "type") or ""
        if self.stopped:
            self.notes("events after message_stop", kind)
            return []
        handler = self._handlers.get(kind)
        if handler is not None:
            return handler(event)
        if kind != "ping":
            self.notes("an unknown event type", kind)
        return []

    def end(self) -> list[p.StreamEvent]:
        if not self.complete:
            raise self.notes.label.error(
                "transport", "the stream ended before the message was complete"
            )
        reason = _STOP.get(self.stop_reason or "", "other")
        if self.stop_reason is None:
            reason = "tool-calls" if self.tools.local_called else "stop"
        return [p.StepFinish(reason=reason, usage=self.usage())]

    def usage(self) -> p.Usage:
        """Anthropic's ``input_tokens`` excludes cache tokens; ``Usage.input`` includes them."""
        read = self._usage.get("cache_read_input_tokens", 0)
        write = self._usage.get("cache_creation_input_tokens", 0)
        return p.Usage(
            input=self._usage.get("input_tokens", 0) + read + write,
            output=self._usage.get("output_tokens", 0),
            cache_read=read,
            cache_write=write,
        )

    # --- message --------------------------------------------------------------------------------

    def _message_start(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        self._merge_usage(f.obj(f.obj(event, "message"), "usage"))
        return []

    def _message_delta(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        self.stop_reason = f.text(f.obj(event, "delta"), "stop_reason") or self.stop_reason
        self._merge_usage(f.obj(event, "usage"))
        return []

    def _message_stop(self, _event: dict[str, Any]) -> list[p.StreamEvent]:
        self.stopped = True
        self._blocks.clear()
        return self.fragments.close_all() + self.tools.finish_all()

    def _merge_usage(self, usage: dict[str, Any]) -> None:
        # message_delta repeats the counts cumulatively: the latest value of each field wins.
        for name in _USAGE_FIELDS:
            value = f.count(usage, name)
            if value is not None:
                self._usage[name] = value

    def _error(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        raise error_from_body(event, self.notes.label, fallback="the stream reported an error")

    # --- blocks ---------------------------------------------------------------------------------

    def _block_start(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        index, block = f.count(event, "index"), f.obj(event, "content_block")
        kind = f.text(block, "type") or ""
        if index is None or index in self._blocks:
            self.notes("a block start without an index or for an open block", index)
            return []
        self._blocks[index] = kind
        if kind in ("text", "thinking"):
            fragment: FragmentKind = "text" if kind == "text" else "reasoning"
            if kind == "thinking" and f.text(block, "signature"):
                self._signatures[index] = f.text(block, "signature") or ""
            opening = self.fragments.start(fragment, index)
            return opening + self.fragments.delta(fragment, index, f.text(block, kind) or "")
        if kind == "redacted_thinking":
            state = {"redactedData": f.text(block, "data") or ""}
            return self.fragments.start("reasoning", index) + self.fragments.end(
                "reasoning", index, state
            )
        if kind in ("tool_use", "server_tool_use"):
            return self._tool_start(index, block, provider_executed=kind == "server_tool_use")
        return self._other_block(index, kind, block)

    def _tool_start(
        self, index: int, block: dict[str, Any], *, provider_executed: bool
    ) -> list[p.StreamEvent]:
        initial = block.get("input")
        return self.tools.start(
            index,
            f.text(block, "id"),
            f.text(block, "name"),
            provider_executed=provider_executed,
            initial=f.dumps(initial) if isinstance(initial, dict) and initial else None,
        )

    def _other_block(self, index: int, kind: str, block: dict[str, Any]) -> list[p.StreamEvent]:
        call_id = f.text(block, "tool_use_id")
        if not kind.endswith("_tool_result") or call_id is None:
            self.notes("an unknown content block type", kind)
            return []
        content = block.get("content")
        failed = isinstance(content, dict) and (f.text(content, "type") or "").endswith("_error")
        return self.tools.result(call_id, content, is_error=failed, metadata={"blockType": kind})

    def _block_delta(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        index, delta = f.count(event, "index"), f.obj(event, "delta")
        kind = f.text(delta, "type") or ""
        if kind == "text_delta":
            return self.fragments.delta("text", index, f.text(delta, "text") or "")
        if kind == "thinking_delta":
            return self.fragments.delta("reasoning", index, f.text(delta, "thinking") or "")
        if kind == "input_json_delta":
            return self.tools.delta(index, f.text(delta, "partial_json") or "")
        if kind == "signature_delta":
            self._sign(index, f.text(delta, "signature") or "")
        elif kind != "citations_delta":
            self.notes("an unknown delta type", kind)
        return []

    def _sign(self, index: int | None, piece: str) -> None:
        if index is None or self._blocks.get(index) != "thinking":
            self.notes("a signature for a block that is not open thinking", index)
            return
        self._signatures[index] = self._signatures.get(index, "") + piece

    def _block_stop(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        index = f.count(event, "index")
        kind = self._blocks.pop(index, None) if index is not None else None
        if kind == "text":
            return self.fragments.end("text", index)
        if kind == "thinking":
            signature = self._signatures.pop(index, None) if index is not None else None
            state = {"signature": signature} if signature else None
            return self.fragments.end("reasoning", index, state)
        if kind in ("tool_use", "server_tool_use"):
            metadata = {"blockType": kind} if kind == "server_tool_use" else None
            return self.tools.finish(index, metadata=metadata)
        if kind is None:
            self.notes("a block stop for a block that is not open", index)
        return []
