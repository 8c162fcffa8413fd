"""``ProviderRequest`` to an Anthropic Messages request body.

Thinking replays as ``thinking`` blocks with their signature (or ``redacted_thinking`` with its
data) only when the part carries this provider's metadata; a hosted web search replays as its
``server_tool_use`` block followed by the stored result block. Tool results go back as
``tool_result`` blocks in one user turn, in call order. The API rejects tool blocks in a request
that defines no tools (the last step of a drain sends none), so then they become text.
Prompt caching: breakpoints on the last system block and on the last message block.
"""

from __future__ import annotations

from typing import Any

from activities.providers import base as p
from activities.providers.convert import (
    hosted_call_text,
    hosted_result_text,
    input_object,
    input_text,
    output_text,
    own_metadata,
    sendable,
    texts,
)
from activities.providers.models import output_limit
from activities.providers.settings import ProviderSettings

WEB_SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
EPHEMERAL = {"type": "ephemeral"}
_UNCACHEABLE = frozenset({"thinking", "redacted_thinking"})


def messages_body(request: p.ProviderRequest, settings: ProviderSettings) -> dict[str, Any]:
    hosted = settings.web_search and request.tool_choice != "none"
    limit = request.max_output_tokens or settings.max_output_tokens or output_limit(request.model)
    body: dict[str, Any] = {
        "model": request.model.id,
        "max_tokens": limit,
        "messages": _Messages(request, hosted=hosted).build(),
    }
    system: list[dict[str, Any]] = [
        {"type": "text", "text": part} for part in request.system if part
    ]
    if system:
        system[-1]["cache_control"] = EPHEMERAL
        body["system"] = system
    tools = [_tool(spec) for spec in request.tools] + ([WEB_SEARCH_TOOL] if hosted else [])
    if tools:
        body["tools"] = tools
        if request.tool_choice is not None:
            body["tool_choice"] = {"type": request.tool_choice}
    budget = settings.anthropic_thinking_budget
    if budget:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = max(limit, budget + 1)  # the API wants room beyond the budget
    return sendable(body)


def _tool(spec: p.ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema}


class _Messages:
    def __init__(self, request: p.ProviderRequest, *, hosted: bool) -> None:
        self.request = request
        self.provider_id = request.model.provider_id
        self.local = bool(request.tools)
        self.hosted = hosted
        self.turns: list[dict[str, Any]] = []

    def build(self) -> list[dict[str, Any]]:
        for message in self.request.messages:
            role = "assistant" if message.role == "assistant" else "user"
            self._add(role, self._blocks(message))
        if self.turns and self.turns[-1]["content"][-1]["type"] not in _UNCACHEABLE:
            self.turns[-1]["content"][-1]["cache_control"] = EPHEMERAL
        return self.turns

    def _add(self, role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if self.turns and self.turns[-1]["role"] == role:
            # Roles must alternate; parallel tool results belong in one user turn anyway.
            self.turns[-1]["content"].extend(blocks)
        else:
            self.turns.append({"role": role, "content": blocks})

    def _blocks(self, message: p.RequestMessage) -> list[dict[str, Any]]:
        if message.role == "system":
            return _text(texts(message))
        if message.role == "assistant":
            return self._assistant(message)
        blocks: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, p.TextPartIn):
                blocks += _text(part.text)
            elif isinstance(part, p.ImagePartIn):
                blocks.append(_image(part))
            elif isinstance(part, p.ToolResultPartIn):
                blocks += self._local_result(part)
        return blocks

    def _local_result(self, part: p.ToolResultPartIn) -> list[dict[str, Any]]:
        if not self.local:
            outcome = "failed" if part.is_error else "returned"
            return _text(f"[tool {part.name} {outcome}: {output_text(part.output)}]")
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": part.call_id,
            "content": output_text(part.output),
        }
        if part.is_error:
            block["is_error"] = True
        return [block]

    def _assistant(self, message: p.RequestMessage) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        native: set[str] = set()
        for part in message.content:
            if isinstance(part, p.TextPartIn):
                blocks += _text(part.text)
            elif isinstance(part, p.ReasoningPartIn):
                blocks += self._thinking(part)
            elif isinstance(part, p.ToolCallPartIn):
                blocks += self._call(part, native)
            elif isinstance(part, p.ToolResultPartIn):
                blocks += self._hosted_result(part, native)
        return blocks

    def _thinking(self, part: p.ReasoningPartIn) -> list[dict[str, Any]]:
        state = own_metadata(part, self.provider_id) or {}
        signature, redacted = state.get("signature"), state.get("redactedData")
        if isinstance(redacted, str):
            return [{"type": "redacted_thinking", "data": redacted}]
        if isinstance(signature, str):
            return [{"type": "thinking", "thinking": part.text, "signature": signature}]
        return _text(part.text)  # unsigned thinking cannot go back as thinking

    def _call(self, part: p.ToolCallPartIn, native: set[str]) -> list[dict[str, Any]]:
        if not part.provider_executed:
            if not self.local:
                return _text(f"[tool {part.name} called with {input_text(part.input)}]")
            return [_tool_use("tool_use", part)]
        if self.hosted and own_metadata(part, self.provider_id) is not None:
            native.add(part.call_id)
            return [_tool_use("server_tool_use", part)]
        return _text(hosted_call_text(part))

    def _hosted_result(self, part: p.ToolResultPartIn, native: set[str]) -> list[dict[str, Any]]:
        state = own_metadata(part, self.provider_id) or {}
        block_type = state.get("blockType")
        if part.call_id not in native or not isinstance(block_type, str):
            return _text(hosted_result_text(part))
        return [{"type": block_type, "tool_use_id": part.call_id, "content": part.output}]


def _tool_use(kind: str, part: p.ToolCallPartIn) -> dict[str, Any]:
    return {"type": kind, "id": part.call_id, "name": part.name, "input": input_object(part.input)}


def _text(text: str) -> list[dict[str, Any]]:
    # The API rejects empty text blocks.
    return [{"type": "text", "text": text}] if text else []


def _image(part: p.ImagePartIn) -> dict[str, Any]:
    source = {"type": "base64", "media_type": part.media_type, "data": part.data}
    return {"type": "image", "source": source}
