"""Assembling normalized events from provider blocks, so hostile streams yield only legal ones.

Every adapter keys its blocks by what its protocol uses (a choice's tool index, a content block
index, an output item id). These helpers turn that into the event order the publisher accepts
(reference §6): one open text and one open reasoning fragment at a time, unique fragment ids, a
tool call only after its input closed, a result only for a call already made, each call id once.
What a stream gets wrong is dropped and logged (a delta for a block that is not open, a second
call with a known id, a second result), or raised as ``invalid_output`` when nothing sensible
remains (a result for a call that never happened).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

from activities.providers import base as p
from activities.providers.errors import Label
from activities.publisher import parse_input

logger = logging.getLogger(__name__)

# The publisher rejects tool input above 1 MiB anyway; buffering more would only cost memory
# (a hostile stream can send 100 MB of arguments).
MAX_TOOL_INPUT_BYTES = 1024 * 1024

FragmentKind = Literal["text", "reasoning"]


class Notes:
    """Logs each kind of stream oddity once per stream, so a hostile stream cannot flood logs."""

    def __init__(self, label: Label) -> None:
        self.label = label
        self._seen: set[str] = set()

    def __call__(self, what: str, detail: object = "") -> None:
        if what in self._seen:
            return
        self._seen.add(what)
        logger.warning("%s: ignored %s %s", self.label, what, detail)


@dataclass
class _Open:
    key: Hashable
    id: str


class Fragments:
    """Text and reasoning fragments: at most one open of each kind, ids unique within a turn."""

    def __init__(self, notes: Notes) -> None:
        self.notes = notes
        self._open: dict[FragmentKind, _Open] = {}
        self._count = 0

    def is_open(self, kind: FragmentKind, key: Hashable) -> bool:
        current = self._open.get(kind)
        return current is not None and current.key == key

    def start(
        self, kind: FragmentKind, key: Hashable, metadata: dict[str, Any] | None = None
    ) -> list[p.StreamEvent]:
        events = self.end(kind, self._open[kind].key) if kind in self._open else []
        self._count += 1
        fragment = _Open(key, f"{kind}-{self._count}")
        self._open[kind] = fragment
        if kind == "text":
            events.append(p.TextStart(id=fragment.id))
        else:
            events.append(p.ReasoningStart(id=fragment.id, metadata=metadata))
        return events

    def delta(self, kind: FragmentKind, key: Hashable, delta: str) -> list[p.StreamEvent]:
        current = self._open.get(kind)
        if current is None or current.key != key:
            self.notes(f"{kind} delta for a block that is not open", key)
            return []
        if not delta:
            return []
        if kind == "text":
            return [p.TextDelta(id=current.id, delta=delta)]
        return [p.ReasoningDelta(id=current.id, delta=delta)]

    def ensure(self, kind: FragmentKind, key: Hashable) -> list[p.StreamEvent]:
        """Open the fragment for ``key`` unless it is the open one (streams that skip starts)."""
        return [] if self.is_open(kind, key) else self.start(kind, key)

    def end(
        self, kind: FragmentKind, key: Hashable, metadata: dict[str, Any] | None = None
    ) -> list[p.StreamEvent]:
        current = self._open.get(kind)
        if current is None or current.key != key:
            self.notes(f"{kind} end for a block that is not open", key)
            return []
        del self._open[kind]
        if kind == "text":
            return [p.TextEnd(id=current.id)]
        return [p.ReasoningEnd(id=current.id, metadata=metadata)]

    def close_all(self) -> list[p.StreamEvent]:
        events: list[p.StreamEvent] = []
        for kind in list(self._open):
            events += self.end(kind, self._open[kind].key)
        return events


@dataclass
class _Call:
    call_id: str
    name: str
    provider_executed: bool
    initial: str | None = None
    chunks: list[str] = field(default_factory=list)
    size: int = 0
    oversized: bool = False
    called: bool = False
    settled: bool = False

    def add(self, delta: str) -> bool:
        """Buffer ``delta``; False once the input passed the cap (nothing more is kept)."""
        self.size += len(delta.encode("utf-8", "surrogatepass"))
        if self.size > MAX_TOOL_INPUT_BYTES:
            self.oversized, self.chunks = True, []
        if self.oversized:
            return False
        self.chunks.append(delta)
        return True

    def input(self, final: str | None) -> str | None:
        """The raw JSON text for the call; ``None`` (rejected as malformed) when oversized."""
        raw = final if final is not None else "".join(self.chunks) or self.initial or ""
        too_big = len(raw.encode("utf-8", "surrogatepass")) > MAX_TOOL_INPUT_BYTES
        return None if self.oversized or too_big else raw


class ToolCalls:
    """Tool calls of one turn, keyed by the provider's block key while their input streams.

    A local call's input is handed to the publisher as raw JSON text: the publisher parses it
    with its caps and turns malformed input into a ``tool.input-json`` error the model can read.
    A provider-executed call's input is parsed here, since that call ran whatever it was sent.
    """

    def __init__(self, notes: Notes) -> None:
        self.notes = notes
        self._open: dict[Hashable, _Call | None] = {}  # None: a dropped duplicate's block
        self._calls: dict[str, _Call] = {}
        self.local_called = False

    def is_open(self, key: Hashable) -> bool:
        return key in self._open

    def start(
        self,
        key: Hashable,
        call_id: str | None,
        name: str | None,
        *,
        provider_executed: bool = False,
        initial: str | None = None,
    ) -> list[p.StreamEvent]:
        if key in self._open:
            self.notes("a second start for an open tool block", key)
            return []
        if not call_id or not name:
            self.notes("a tool call without an id or a name", key)
            self._open[key] = None
            return []
        if call_id in self._calls:
            self.notes("a second tool call with a known id", call_id)
            self._open[key] = None
            return []
        call = _Call(call_id, name, provider_executed, initial=initial)
        self._open[key] = self._calls[call_id] = call
        return [p.ToolInputStart(id=call_id, name=name)]

    def delta(self, key: Hashable, delta: str) -> list[p.StreamEvent]:
        if key not in self._open:
            self.notes("tool input for a block that is not open", key)
            return []
        call = self._open[key]
        if call is None or not delta or not call.add(delta):
            return []
        return [p.ToolInputDelta(id=call.call_id, delta=delta)]

    def finish(
        self, key: Hashable, *, final: str | None = None, metadata: dict[str, Any] | None = None
    ) -> list[p.StreamEvent]:
        """Close the block's input and make the call (``final``: the provider's full input)."""
        if key not in self._open:
            self.notes("a tool block end that is not open", key)
            return []
        call = self._open.pop(key)
        if call is None:
            return []
        call.called = True
        self.local_called |= not call.provider_executed
        return [
            p.ToolInputEnd(id=call.call_id),
            p.ToolCall(
                call_id=call.call_id,
                name=call.name,
                input=self._input(call, final),
                provider_executed=call.provider_executed,
                metadata=metadata,
            ),
        ]

    def _input(self, call: _Call, final: str | None) -> str | dict[str, Any] | None:
        raw = call.input(final)
        if not call.provider_executed:
            return raw  # the publisher rejects malformed input with an error the model reads
        parsed = parse_input(raw)
        if parsed is None:
            # The provider already ran it: "not executed" would be false, and its result must
            # still settle it. Only the record of what it was asked is lost.
            self.notes("malformed input of a provider-executed call", call.call_id)
            return {}
        return parsed

    def finish_all(self) -> list[p.StreamEvent]:
        """Close every open block, in the order they opened (the response completed)."""
        events: list[p.StreamEvent] = []
        for key in list(self._open):
            events += self.finish(key)
        return events

    def result(
        self,
        call_id: str | None,
        result: Any,
        *,
        is_error: bool = False,
        metadata: dict[str, Any] | None = None,
    ) -> list[p.StreamEvent]:
        """A provider-executed tool's result: only for a call already made, and only once."""
        call = self._calls.get(call_id) if call_id else None
        if call is None or not call.called:
            raise self.notes.label.error("invalid_output", f"Tool result before call: {call_id}")
        if call.settled or not call.provider_executed:
            # A second result, or one for a call the worker runs itself: the model's own
            # words cannot settle a local tool.
            self.notes("a result for a settled or local call", call_id)
            return []
        call.settled = True
        return [
            p.ToolResult(
                call_id=call.call_id,
                name=call.name,
                result=result,
                is_error=is_error,
                provider_executed=call.provider_executed,
                metadata=metadata,
            )
        ]
