"""``ProviderRequest`` to a Responses API request body.

Requests are stateless (``store: false``): every turn replays the whole history, so reasoning must
come back as items with their id and encrypted content (requested with
``include: ["reasoning.encrypted_content"]``), and a hosted web search as its ``web_search_call``
item with the action and sources. Only parts carrying this provider's metadata replay natively
(``history.py`` decides); the rest becomes assistant text.
"""

from __future__ import annotations

from typing import Any

from activities.providers import base as p
from activities.providers.convert import (
    data_url,
    hosted_call_text,
    hosted_result_text,
    input_object,
    input_text,
    output_text,
    own_metadata,
    sendable,
    texts,
)
from activities.providers.models import is_reasoning
from activities.providers.openai_responses_stream import WEB_SEARCH
from activities.providers.settings import ProviderSettings


def responses_body(request: p.ProviderRequest, settings: ProviderSettings) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model.id,
        "input": _input(request),
        "store": False,
    }
    instructions = "\n\n".join(part for part in request.system if part)
    if instructions:
        body["instructions"] = instructions
    if is_reasoning(request.model):
        # Non-reasoning models reject a reasoning configuration, so only reasoning models get it.
        body["include"] = ["reasoning.encrypted_content"]
        body["reasoning"] = {"summary": "auto"}
        if settings.reasoning_effort:
            body["reasoning"]["effort"] = settings.reasoning_effort
    tools = [_tool(spec) for spec in request.tools]
    if settings.web_search and request.tool_choice != "none":
        tools.append({"type": WEB_SEARCH})
    if tools:
        body["tools"] = tools
        if request.tool_choice is not None:
            body["tool_choice"] = request.tool_choice
    if request.prompt_cache_key:
        body["prompt_cache_key"] = request.prompt_cache_key
    limit = request.max_output_tokens or settings.max_output_tokens
    if limit is not None:
        body["max_output_tokens"] = limit
    return sendable(body)


def _tool(spec: p.ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.input_schema,
        # Strict mode needs every schema to forbid extra keys; tool schemas here do not promise it.
        "strict": False,
    }


def _input(request: p.ProviderRequest) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in request.messages:
        items.extend(_items(message, request.model.provider_id))
    return items


def _items(message: p.RequestMessage, provider_id: str) -> list[dict[str, Any]]:
    if message.role == "system":
        return [{"role": "system", "content": texts(message)}]
    if message.role == "user":
        return [{"role": "user", "content": _user_content(message)}]
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": part.call_id,
                "output": output_text(part.output),
            }
            for part in message.content
            if isinstance(part, p.ToolResultPartIn)
        ]
    return _Assistant(message, provider_id).items()


def _user_content(message: p.RequestMessage) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, p.TextPartIn):
            content.append({"type": "input_text", "text": part.text})
        elif isinstance(part, p.ImagePartIn):
            content.append({"type": "input_image", "image_url": data_url(part), "detail": "auto"})
    return content


class _Assistant:
    """One assistant message as input items, in the order its parts happened."""

    def __init__(self, message: p.RequestMessage, provider_id: str) -> None:
        self.parts = message.content
        self.provider_id = provider_id
        self.out: list[dict[str, Any]] = []
        self.text: list[str] = []
        self.results = {
            part.call_id: part for part in self.parts if isinstance(part, p.ToolResultPartIn)
        }
        self.native: set[str] = set()

    def items(self) -> list[dict[str, Any]]:
        for part in self.parts:
            if isinstance(part, p.TextPartIn):
                self._say(part.text)
            elif isinstance(part, p.ReasoningPartIn):
                self._reasoning(part)
            elif isinstance(part, p.ToolCallPartIn):
                self._call(part)
            elif isinstance(part, p.ToolResultPartIn) and part.call_id not in self.native:
                self._say(hosted_result_text(part))
        self._flush()
        return self.out

    def _say(self, text: str) -> None:
        if text:
            self.text.append(text)

    def _flush(self) -> None:
        if self.text:
            self.out.append({"role": "assistant", "content": "\n\n".join(self.text)})
            self.text = []

    def _emit(self, item: dict[str, Any]) -> None:
        self._flush()
        self.out.append(item)

    def _reasoning(self, part: p.ReasoningPartIn) -> None:
        state = own_metadata(part, self.provider_id) or {}
        item_id, encrypted = state.get("itemId"), state.get("reasoningEncryptedContent")
        if not isinstance(item_id, str) or not isinstance(encrypted, str):
            # Without its encrypted content a stateless request cannot refer to the item.
            self._say(part.text)
            return
        summary = [{"type": "summary_text", "text": part.text}] if part.text else []
        self._emit(
            {"type": "reasoning", "id": item_id, "summary": summary, "encrypted_content": encrypted}
        )

    def _call(self, part: p.ToolCallPartIn) -> None:
        if not part.provider_executed:
            # No item id: an id would tie the call to a reasoning item that may not be replayed.
            self._emit(
                {
                    "type": "function_call",
                    "call_id": part.call_id,
                    "name": part.name,
                    "arguments": input_text(part.input),
                }
            )
            return
        state = own_metadata(part, self.provider_id) or {}
        item_id = state.get("itemId")
        if part.name != WEB_SEARCH or not isinstance(item_id, str):
            self._say(hosted_call_text(part))
            return
        self.native.add(part.call_id)
        self._emit(_web_search_item(item_id, part, self.results.get(part.call_id)))


def _web_search_item(
    item_id: str, call: p.ToolCallPartIn, result: p.ToolResultPartIn | None
) -> dict[str, Any]:
    action = input_object(call.input)
    output = result.output if result is not None else None
    sources = output.get("sources") if isinstance(output, dict) else None
    if sources:
        action = {**action, "sources": sources}
    status = "completed" if result is not None and not result.is_error else "failed"
    if result is not None and isinstance(output, dict) and isinstance(output.get("status"), str):
        status = output["status"]
    return {"type": "web_search_call", "id": item_id, "status": status, "action": action}
