"""``ProviderRequest`` to a Chat Completions request body (OpenAI and compatible servers).

Chat Completions has no hosted tools and no replayable reasoning: reasoning is left out (servers
that stream ``reasoning_content``, such as DeepSeek, reject it in requests), and a provider-executed
call from another provider's turn becomes assistant text.
"""

from __future__ import annotations

from typing import Any

from activities.providers import base as p
from activities.providers.convert import (
    data_url,
    hosted_call_text,
    hosted_result_text,
    input_text,
    output_text,
    sendable,
    texts,
)
from activities.providers.settings import ProviderSettings


def chat_body(request: p.ProviderRequest, settings: ProviderSettings) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": request.model.id,
        "messages": _messages(request),
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [_tool(spec) for spec in request.tools]
        if request.tool_choice is not None:
            # Only with tools: the API rejects a tool_choice when no tools are specified.
            body["tool_choice"] = request.tool_choice
    if request.prompt_cache_key:
        body["prompt_cache_key"] = request.prompt_cache_key
    limit = request.max_output_tokens or settings.max_output_tokens
    if limit is not None:
        # OpenAI's reasoning models take only the new name; compatible servers know the old one.
        key = "max_tokens" if settings.chat_base_url else "max_completion_tokens"
        body[key] = limit
    return sendable(body)


def _tool(spec: p.ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.input_schema,
        },
    }


def _messages(request: p.ProviderRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": s} for s in request.system if s]
    for message in request.messages:
        out.extend(_message(message))
    return out


def _message(message: p.RequestMessage) -> list[dict[str, Any]]:
    if message.role == "system":
        return [{"role": "system", "content": texts(message)}]
    if message.role == "user":
        return [{"role": "user", "content": _user_content(message)}]
    if message.role == "tool":
        return [
            {"role": "tool", "tool_call_id": part.call_id, "content": output_text(part.output)}
            for part in message.content
            if isinstance(part, p.ToolResultPartIn)
        ]
    assistant = _assistant(message)
    return [assistant] if assistant is not None else []


def _user_content(message: p.RequestMessage) -> str | list[dict[str, Any]]:
    parts = message.content
    if all(isinstance(part, p.TextPartIn) for part in parts):
        # Plain text as a string: the form every compatible server accepts.
        return texts(message)
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, p.TextPartIn):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, p.ImagePartIn):
            content.append({"type": "image_url", "image_url": {"url": data_url(part)}})
    return content


def _assistant(message: p.RequestMessage) -> dict[str, Any] | None:
    segments: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, p.TextPartIn) and part.text:
            segments.append(part.text)
        elif isinstance(part, p.ToolCallPartIn):
            if part.provider_executed:
                segments.append(hosted_call_text(part))
            else:
                calls.append(_call(part))
        elif isinstance(part, p.ToolResultPartIn) and part.provider_executed:
            segments.append(hosted_result_text(part))
    if not segments and not calls:
        return None
    assistant: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(segments) or None}
    if calls:
        assistant["tool_calls"] = calls
    return assistant


def _call(part: p.ToolCallPartIn) -> dict[str, Any]:
    return {
        "id": part.call_id,
        "type": "function",
        "function": {"name": part.name, "arguments": input_text(part.input)},
    }
