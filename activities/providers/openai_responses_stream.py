"""Responses API stream events to normalized events.

Output items open with ``response.output_item.added`` and close with ``...done``, which carries the
finished item: a message (text), a reasoning item (summary text streamed; id and encrypted content
kept as replay metadata ``{itemId, reasoningEncryptedContent}``), a function call (arguments
streamed), or a hosted ``web_search_call`` (reported as a provider-executed call plus its result).
``response.completed`` / ``response.incomplete`` end the turn with usage; ``response.failed`` and
``error`` raise the classified failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from activities.providers import base as p
from activities.providers import fields as f
from activities.providers.assembly import Fragments, Notes, ToolCalls
from activities.providers.errors import Label, error_from_body

WEB_SEARCH = "web_search"
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content-filter"}
# Progress and echo events that add nothing the item events do not carry.
_QUIET = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.done",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
        "response.function_call_arguments.done",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    }
)


class ResponsesParser:
    def __init__(self, label: Label) -> None:
        self.notes = Notes(label)
        self.fragments = Fragments(self.notes)
        self.tools = ToolCalls(self.notes)
        self.finish: str | None = None
        self.usage = p.Usage()
        self._kinds: dict[str, str] = {}  # open item key -> item type
        self._summary_parts: dict[str, int] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], list[p.StreamEvent]]] = {
            "response.output_item.added": self._added,
            "response.output_item.done": self._done,
            "response.output_text.delta": self._text_delta,
            "response.refusal.delta": self._text_delta,
            "response.reasoning_summary_part.added": self._summary_part,
            "response.reasoning_summary_text.delta": self._reasoning_delta,
            "response.reasoning_text.delta": self._reasoning_delta,
            "response.function_call_arguments.delta": self._arguments_delta,
            "response.completed": self._completed,
            "response.incomplete": self._completed,
            "response.failed": self._failed,
            "error": self._error,
        }

    @property
    def complete(self) -> bool:
        return self.finish is not None

    def feed(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        kind = f.text(event, "type") or ""
        handler = self._handlers.get(kind)
        if self.finish is not None:
            self.notes("events after the response completed", kind)
            return []
        if handler is not None:
            return handler(event)
        if kind not in _QUIET:
            self.notes("an unknown event type", kind)
        return []

    def end(self) -> list[p.StreamEvent]:
        if self.finish is None:
            raise self.notes.label.error(
                "transport", "the stream ended before the response completed"
            )
        reason = self.finish
        if reason == "stop" and self.tools.local_called:
            reason = "tool-calls"
        return [p.StepFinish(reason=reason, usage=self.usage)]

    # --- items ----------------------------------------------------------------------------------

    def _added(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        item = f.obj(event, "item")
        key, kind = _key(event, item), f.text(item, "type") or ""
        if key in self._kinds:
            self.notes("a second start for an open item", key)
            return []
        self._kinds[key] = kind
        if kind == "message":
            return self.fragments.start("text", key)
        if kind == "reasoning":
            # Only the id: encrypted content in an ``added`` event may be incomplete.
            return self.fragments.start("reasoning", key, _item_state(item, key))
        if kind == "function_call":
            return self.tools.start(key, f.text(item, "call_id"), f.text(item, "name"))
        if kind != "web_search_call":
            self.notes("an unknown output item type", kind)
        return []

    def _done(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        item = f.obj(event, "item")
        key = _key(event, item)
        kind = self._kinds.pop(key, None)
        if kind is None:
            # A server that sends only finished items: play the item as if it had streamed.
            added = self._added({"item": item, "item_id": key})
            return added + self._backfill(item, key) + self._done(event)
        if kind == "message":
            return self.fragments.end("text", key)
        if kind == "reasoning":
            return self.fragments.end("reasoning", key, _reasoning_state(item, key))
        if kind == "function_call":
            final = f.text(item, "arguments")
            return self.tools.finish(key, final=final, metadata=_item_state(item, key))
        if kind == "web_search_call":
            return self._web_search(item, key)
        return []

    def _backfill(self, item: dict[str, Any], key: str) -> list[p.StreamEvent]:
        kind = f.text(item, "type")
        if kind == "message":
            return self.fragments.delta("text", key, _joined(item, "content", ("text", "refusal")))
        if kind == "reasoning":
            return self.fragments.delta("reasoning", key, _joined(item, "summary", ("text",)))
        return []

    def _web_search(self, item: dict[str, Any], key: str) -> list[p.StreamEvent]:
        action = dict(f.obj(item, "action"))
        sources = action.pop("sources", None)
        status = f.text(item, "status") or "completed"
        state = _item_state(item, key)
        events = self.tools.start(key, key, WEB_SEARCH, provider_executed=True)
        if not events:
            return []
        events += self.tools.finish(key, final=f.dumps(action), metadata=state)
        result = {"status": status, "sources": sources if isinstance(sources, list) else []}
        return events + self.tools.result(key, result, is_error=status == "failed", metadata=state)

    # --- deltas ---------------------------------------------------------------------------------

    def _text_delta(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        return self.fragments.delta("text", _item_id(event), f.text(event, "delta") or "")

    def _summary_part(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        key = _item_id(event)
        parts = self._summary_parts.get(key, 0)
        self._summary_parts[key] = parts + 1
        # Summary parts are paragraphs of one reasoning item: keep them apart in its text.
        return self.fragments.delta("reasoning", key, "\n\n") if parts else []

    def _reasoning_delta(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        return self.fragments.delta("reasoning", _item_id(event), f.text(event, "delta") or "")

    def _arguments_delta(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        return self.tools.delta(_item_id(event), f.text(event, "delta") or "")

    # --- the end --------------------------------------------------------------------------------

    def _completed(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        response = f.obj(event, "response")
        self.usage = _usage(f.obj(response, "usage"))
        reason = f.text(f.obj(response, "incomplete_details"), "reason")
        self.finish = "stop" if reason is None else _INCOMPLETE.get(reason, "other")
        self._kinds.clear()
        return self.fragments.close_all() + self.tools.finish_all()

    def _failed(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        error = f.obj(f.obj(event, "response"), "error")
        raise error_from_body(error, self.notes.label, fallback="the response failed")

    def _error(self, event: dict[str, Any]) -> list[p.StreamEvent]:
        raise error_from_body(event, self.notes.label, fallback="the stream reported an error")


def _item_id(event: dict[str, Any]) -> str:
    return f.text(event, "item_id") or f"#{f.count(event, 'output_index')}"


def _key(event: dict[str, Any], item: dict[str, Any]) -> str:
    return f.text(item, "id") or _item_id(event)


def _item_state(item: dict[str, Any], key: str) -> dict[str, Any]:
    return {"itemId": f.text(item, "id") or key}


def _reasoning_state(item: dict[str, Any], key: str) -> dict[str, Any]:
    state = _item_state(item, key)
    encrypted = f.text(item, "encrypted_content")
    if encrypted:
        state["reasoningEncryptedContent"] = encrypted
    return state


def _joined(item: dict[str, Any], key: str, names: tuple[str, ...]) -> str:
    """The text of an item's parts (message content, reasoning summary), paragraphs apart."""
    pieces = []
    for part in f.items(item, key):
        if isinstance(part, dict):
            pieces += [f.text(part, name) or "" for name in names]
    return "\n\n".join(piece for piece in pieces if piece)


def _usage(usage: dict[str, Any]) -> p.Usage:
    return p.Usage(
        input=f.count(usage, "input_tokens") or 0,
        output=f.count(usage, "output_tokens") or 0,
        reasoning=f.count(f.obj(usage, "output_tokens_details"), "reasoning_tokens") or 0,
        cache_read=f.count(f.obj(usage, "input_tokens_details"), "cached_tokens") or 0,
    )
