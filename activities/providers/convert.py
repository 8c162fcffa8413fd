"""Request-building helpers the adapters share (history to provider messages, reference §4.10).

``history.py`` already decided what may be replayed: a part carries provider metadata under a
provider's key only when it may go back to that provider and model. Adapters read only their own
key, and render anything they cannot replay natively as plain text, so no context is lost.
"""

from __future__ import annotations

import json
from typing import Any

from activities.providers import base as p


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
