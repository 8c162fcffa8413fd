"""Request-building helpers the adapters share (history to provider messages, reference §4.10).

``history.py`` already decided what may be replayed: a part carries provider metadata under a
provider's key only when it may go back to that provider and model. Adapters read only their own
key, and render anything they cannot replay natively as plain text, so no context is lost.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar, cast

from pydantic import BaseModel

from activities.providers import base as p

_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def own_metadata(
    part: p.ReasoningPartIn | p.ToolCallPartIn | p.ToolResultPartIn, provider_id: str
) -> dict[str, Any] | None:
    """This provider's replay state for ``part``, or ``None`` when it must not be replayed."""
    metadata = (part.provider_metadata or {}).get(provider_id)
    return metadata if isinstance(metadata, dict) and metadata else None


def input_object(value: Any) -> dict[str, Any]:
    """A tool call's input as the JSON object the APIs require (a pending raw string parsed)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def input_text(value: Any) -> str:
    """A tool call's input as JSON text (Chat Completions and Responses ``arguments``)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def output_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def data_url(image: p.ImagePartIn) -> str:
    return f"data:{image.media_type};base64,{image.data}"


def hosted_call_text(call: p.ToolCallPartIn) -> str:
    return f"[provider tool {call.name} called with {input_text(call.input)}]"


def hosted_result_text(result: p.ToolResultPartIn) -> str:
    outcome = "failed" if result.is_error else "returned"
    return f"[provider tool {result.name} {outcome}: {output_text(result.output)}]"


def texts(message: p.RequestMessage) -> str:
    """A message's text parts joined, for roles that take only text (system)."""
    return "\n\n".join(part.text for part in message.content if isinstance(part, p.TextPartIn))


def holds_surrogate(value: Any) -> bool:
    """Whether a lone surrogate is anywhere in ``value`` (models, containers, keys, strings)."""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, BaseModel):
        return any(holds_surrogate(v) for v in vars(value).values())
    if isinstance(value, dict):
        return any(holds_surrogate(k) or holds_surrogate(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(holds_surrogate(v) for v in value)
    return False


def sendable(value: T) -> T:
    """``value`` (JSON data) with each lone surrogate replaced by U+FFFD.

    The store keeps them exactly (a model's split emoji, a tool's invalid UTF-8), but no request
    body can be encoded with one: sent as is, the history would fail every later turn, so the
    model reads the replacement character instead. Unchanged data comes back as it was.
    """
    if not holds_surrogate(value):
        return value
    return cast(T, _replaced(value))


def _replaced(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replaced(k): _replaced(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_replaced(v) for v in value]
    return value
