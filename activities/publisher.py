"""Turn one provider stream into durable session events (reference §4.6, validation §6).

A ``TurnPublisher`` is the per-attempt state machine: it validates the order and identity of the
provider's events, and queues the session events to append. It never touches the store; the
turn activity flushes its queue in short batches. Validation failures raise
``StreamProtocolError`` with the reference's exact texts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from activities.providers import base as p
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, SessionError, TextContent, Tokens
from sessionflow.models.drain import CallRef

MAX_INPUT_BYTES = 1024 * 1024
MAX_INPUT_DEPTH = 64
INPUT_JSON_ERROR = (
    "Tool call arguments were malformed JSON and were not executed. Retry with valid JSON."
)


class StreamProtocolError(Exception):
    """The provider stream broke the event order or identity rules; the turn cannot continue."""


@dataclass
class _Tool:
    name: str
    input_text: str = ""
    input_started: bool = False
    input_ended: bool = False
    called: bool = False
    settled: bool = False
    executed: bool = False


@dataclass
class _Fragment:
    id: str
    ordinal: int
    text: str = ""
    state: dict[str, Any] | None = None


@dataclass
class TurnPublisher:
    session_id: str
    assistant_message_id: str
    agent: str
    model: ModelRef
    attempt: int = 1
    queue: list[ev.Event] = field(default_factory=list)
    tools: dict[str, _Tool] = field(default_factory=dict)
    local_calls: list[CallRef] = field(default_factory=list)
    step_started: bool = False
    retry_evidence: bool = False
    provider_failed: bool = False
    step_failure: SessionError | None = None
    finish: str | None = None
    tokens: Tokens | None = None
    _text: _Fragment | None = None
    _reasoning: _Fragment | None = None
    _ordinals: dict[str, int] = field(default_factory=lambda: {"text": 0, "reasoning": 0})

    # --- the queue ------------------------------------------------------------------------------

    def take(self) -> list[ev.Event]:
        events, self.queue = self.queue, []
        return events

    def _emit(self, event: ev.Event) -> None:
        self.queue.append(event)

    def _ids(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "assistant_message_id": self.assistant_message_id}

    def start_assistant(self) -> None:
        if not self.step_started:
            self.step_started = True
            self._emit(
                ev.StepStarted(
                    **self._ids(), agent=self.agent, model=self.model, attempt=self.attempt
                )
            )

    # --- events ---------------------------------------------------------------------------------

    def handle(self, event: p.StreamEvent) -> list[CallRef]:
        """Queue the session events for ``event``; returns local calls that became ``called``."""
        self.start_assistant()
        if isinstance(event, p.TextStart | p.TextDelta | p.TextEnd):
            self._fragment("text", event)
        elif isinstance(event, p.ReasoningStart | p.ReasoningDelta | p.ReasoningEnd):
            self._fragment("reasoning", event)
        elif isinstance(event, p.ToolInputStart | p.ToolInputDelta | p.ToolInputEnd):
            self._tool_input(event)
        elif isinstance(event, p.ToolCall):
            return self._tool_call(event)
        elif isinstance(event, p.ToolResult):
            self._tool_result(event)
        elif isinstance(event, p.ToolErrorEvent):
            self._tool_error(event)
        elif isinstance(event, p.StepFinish):
            self._step_finish(event)
        elif isinstance(event, p.ProviderErrorEvent):
            self.provider_failed = True
            self.fail_assistant(SessionError(type="provider.unknown", message=event.message), True)
        return []

    def _fragment(self, kind: str, event: Any) -> None:
        current = self._text if kind == "text" else self._reasoning
        name = kind.capitalize() if kind == "reasoning" else kind
        if isinstance(event, p.TextStart | p.ReasoningStart):
            self.retry_evidence = True
            if current is not None and current.id == event.id:
                raise StreamProtocolError(f"Duplicate {kind} start: {event.id}")
            if current is not None:
                raise StreamProtocolError(f"{kind} start before end: {event.id}")
            fragment = _Fragment(event.id, self._ordinals[kind])
            self._ordinals[kind] += 1
            self._open(kind, fragment)
            if kind == "text":
                self._emit(ev.TextStarted(**self._ids(), ordinal=fragment.ordinal))
            else:
                assert isinstance(event, p.ReasoningStart)
                fragment.state = _merge(None, event.metadata)
                self._emit(
                    ev.ReasoningStarted(
                        **self._ids(), ordinal=fragment.ordinal, state=fragment.state
                    )
                )
            return
        if current is None or current.id != event.id:
            verb = "delta" if isinstance(event, p.TextDelta | p.ReasoningDelta) else "end"
            raise StreamProtocolError(f"{name} {verb} before start: {event.id}")
        if isinstance(event, p.TextDelta | p.ReasoningDelta):
            current.text += event.delta
            if isinstance(event, p.ReasoningDelta):
                current.state = _merge(current.state, event.metadata)
                self._emit(
                    ev.ReasoningDelta(**self._ids(), ordinal=current.ordinal, delta=event.delta)
                )
            else:
                self._emit(ev.TextDelta(**self._ids(), ordinal=current.ordinal, delta=event.delta))
            return
        if isinstance(event, p.ReasoningEnd):
            current.state = _merge(current.state, event.metadata)
        self._close(kind)

    def _open(self, kind: str, fragment: _Fragment) -> None:
        if kind == "text":
            self._text = fragment
        else:
            self._reasoning = fragment

    def _close(self, kind: str) -> None:
        if kind == "text" and self._text is not None:
            text, self._text = self._text, None
            self._emit(ev.TextEnded(**self._ids(), ordinal=text.ordinal, text=text.text))
        elif kind == "reasoning" and self._reasoning is not None:
            reasoning, self._reasoning = self._reasoning, None
            self._emit(
                ev.ReasoningEnded(
                    **self._ids(),
                    ordinal=reasoning.ordinal,
                    text=reasoning.text,
                    state=reasoning.state,
                )
            )

    def _tool_input(self, event: p.ToolInputStart | p.ToolInputDelta | p.ToolInputEnd) -> None:
        tool = self.tools.get(event.id)
        if isinstance(event, p.ToolInputStart):
            self.retry_evidence = True
            if tool is not None:
                raise StreamProtocolError(f"Duplicate tool input start: {event.id}")
            self._start_input(event.id, event.name)
            return
        if isinstance(event, p.ToolInputDelta):
            if tool is None or not tool.input_started:
                raise StreamProtocolError(f"Tool input delta before start: {event.id}")
            if tool.input_ended:
                raise StreamProtocolError(f"Tool input delta after end: {event.id}")
            tool.input_text += event.delta
            self._emit(ev.ToolInputDelta(**self._ids(), call_id=event.id, delta=event.delta))
            return
        if tool is None or not tool.input_started:
            raise StreamProtocolError(f"Tool input end before start: {event.id}")
        if tool.input_ended:
            raise StreamProtocolError(f"Duplicate tool input end: {event.id}")
        self._end_input(event.id, tool)

    def _start_input(self, call_id: str, name: str) -> _Tool:
        tool = self.tools[call_id] = _Tool(name=name, input_started=True)
        self._emit(ev.ToolInputStarted(**self._ids(), call_id=call_id, name=name))
        return tool

    def _end_input(self, call_id: str, tool: _Tool) -> None:
        tool.input_ended = True
        self._emit(ev.ToolInputEnded(**self._ids(), call_id=call_id, text=tool.input_text))

    def _tool_call(self, event: p.ToolCall) -> list[CallRef]:
        self.retry_evidence = True
        tool = self.tools.get(event.call_id)
        if tool is not None and tool.called:
            raise StreamProtocolError(f"Duplicate tool call: {event.call_id}")
        if tool is not None and tool.name != event.name:
            raise StreamProtocolError(
                f"Tool call name changed for {event.call_id}: {tool.name} -> {event.name}"
            )
        if tool is None:
            tool = self._start_input(event.call_id, event.name)
        if not tool.input_ended:
            self._end_input(event.call_id, tool)
        tool.called, tool.executed = True, event.provider_executed
        parsed = parse_input(event.input)
        if parsed is None:
            tool.settled = True
            error = SessionError(type="tool.input-json", message=INPUT_JSON_ERROR)
            self._emit(ev.ToolFailed(**self._ids(), call_id=event.call_id, error=error))
            return []
        self._emit(
            ev.ToolCalled(
                **self._ids(),
                call_id=event.call_id,
                name=event.name,
                input=parsed,
                executed=event.provider_executed,
                state=event.metadata,
            )
        )
        if event.provider_executed:
            return []
        call = CallRef(call_id=event.call_id, name=event.name)
        self.local_calls.append(call)
        return [call]

    def _settling(self, call_id: str, name: str, what: str) -> _Tool:
        tool = self.tools.get(call_id)
        if tool is None or not tool.called:
            raise StreamProtocolError(f"Tool {what} before call: {call_id}")
        if tool.name != name:
            raise StreamProtocolError(
                f"Tool {what} name changed for {call_id}: {tool.name} -> {name}"
            )
        return tool

    def _tool_result(self, event: p.ToolResult) -> None:
        tool = self._settling(event.call_id, event.name, "result")
        if tool.settled:
            if event.is_error:
                return
            raise StreamProtocolError(f"Duplicate tool result: {event.call_id}")
        tool.settled = True
        if event.is_error:
            error = SessionError(type="tool.execution", message=_text_of(event.result))
            self._emit(
                ev.ToolFailed(
                    **self._ids(),
                    call_id=event.call_id,
                    error=error,
                    result=event.result,
                    executed=event.provider_executed,
                    result_state=event.metadata,
                )
            )
            return
        self._emit(
            ev.ToolSucceeded(
                **self._ids(),
                call_id=event.call_id,
                structured=event.result if isinstance(event.result, dict) else {},
                content=(TextContent(text=_text_of(event.result)),),
                result=event.result if event.provider_executed else None,
                executed=event.provider_executed,
                result_state=event.metadata,
            )
        )

    def _tool_error(self, event: p.ToolErrorEvent) -> None:
        tool = self._settling(event.call_id, event.name, "error")
        if tool.settled:
            raise StreamProtocolError(f"Duplicate tool error: {event.call_id}")
        tool.settled = True
        unknown = event.message == f"Unknown tool: {event.name}"
        error = SessionError(
            type="tool.unknown" if unknown else "tool.execution", message=event.message
        )
        self._emit(
            ev.ToolFailed(**self._ids(), call_id=event.call_id, error=error, executed=tool.executed)
        )

    def _step_finish(self, event: p.StepFinish) -> None:
        if self.finish is not None:
            raise StreamProtocolError("Duplicate step finish")
        self.flush()
        self.finish = event.reason
        self.tokens = normalize_usage(event.usage)
        if event.reason == "content-filter":
            self.provider_failed = True
            error = SessionError(
                type="provider.content-filter", message="Provider blocked the response"
            )
            self.fail_assistant(error, True)

    # --- settlement -----------------------------------------------------------------------------

    def flush(self) -> None:
        """End every open fragment with its partial text, so nothing streamed is lost."""
        self._close("text")
        self._close("reasoning")
        for call_id, tool in self.tools.items():
            if tool.input_started and not tool.input_ended:
                self._end_input(call_id, tool)

    def fail_assistant(self, error: SessionError, replace: bool = False) -> None:
        self.flush()
        self.start_assistant()
        if self.step_failure is None or replace:
            self.step_failure = error


def normalize_usage(usage: p.Usage) -> Tokens:
    """Reference §4.6: input without cached tokens, output without reasoning."""
    cached = usage.cache_read + usage.cache_write
    return Tokens.model_validate(
        {
            "input": max(0, usage.input - cached),
            "output": max(0, usage.output - usage.reasoning),
            "reasoning": usage.reasoning,
            "cache": {"read": max(0, usage.cache_read), "write": max(0, usage.cache_write)},
        }
    )


def parse_input(raw: Any) -> dict[str, Any] | None:
    """Tool input as an object; None when it is malformed, too deep or too large."""
    if isinstance(raw, str):
        if len(raw.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
            return None
        if _nesting(raw) > MAX_INPUT_DEPTH:
            return None
        try:
            raw = json.loads(
                raw or "{}", parse_constant=_reject_constant, object_pairs_hook=_unique_keys
            )
        except (ValueError, RecursionError):
            return None
    return raw if isinstance(raw, dict) else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated key is malformed input, not "last one wins": parsers disagree on which copy
    # counts (Python and JavaScript keep the last, others the first or fail), so running the
    # call would act on a reading the model may not have meant. The model gets the error.
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key is repeated")
    return found


def _nesting(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _merge(state: dict[str, Any] | None, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    if not metadata:
        return state
    return {**(state or {}), **metadata}
