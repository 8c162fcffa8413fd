"""The OpenAI-compatible Chat Completions adapter: ``openai-chat/<model>``.

Talks to OpenAI or to any server that speaks Chat Completions (vLLM, Ollama, LM Studio, gateways).
Settings (see ``settings.py``): ``SESSIONFLOW_OPENAI_CHAT_BASE_URL`` (else ``OPENAI_BASE_URL``,
else OpenAI), ``SESSIONFLOW_OPENAI_CHAT_API_KEY`` (else ``OPENAI_API_KEY``; a placeholder for a
custom base URL, since local servers need none), ``SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT``,
``SESSIONFLOW_PROVIDER_READ_TIMEOUT``, ``SESSIONFLOW_MAX_OUTPUT_TOKENS``.

Streams text, ``reasoning_content``/``reasoning``, tool calls assembled from indexed argument
deltas, usage with cached and reasoning tokens (``stream_options.include_usage``) and finish
reasons (stop, tool-calls, length, content-filter). Sends ``prompt_cache_key``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from activities.providers import base as p
from activities.providers.clients import openai_client
from activities.providers.errors import Label
from activities.providers.openai_chat_request import chat_body
from activities.providers.openai_chat_stream import ChatParser
from activities.providers.relay import SdkStream, relay
from activities.providers.settings import ProviderSettings

KEY_ENV = "SESSIONFLOW_OPENAI_CHAT_API_KEY or OPENAI_API_KEY"


class OpenAIChatProvider:
    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    def stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        return self._stream(request)

    async def _stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        base_url, api_key = self.settings.chat_endpoint()
        label = Label(
            "OpenAI Chat Completions",
            request.model.id,
            base_url=base_url or "https://api.openai.com/v1",
            key_env=KEY_ENV,
        )
        if api_key is None:
            raise label.error("auth", "no API key is set.")
        client = openai_client(self.settings, api_key=api_key, base_url=base_url)
        body = chat_body(request, self.settings)

        async def opener() -> SdkStream:
            # The body is built as plain JSON, so the SDK's typed overloads cannot narrow it.
            stream: SdkStream = await client.chat.completions.create(**body, stream=True)
            return stream

        async for event in relay(label, client, opener, ChatParser(label)):
            yield event
