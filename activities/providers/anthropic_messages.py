"""The Anthropic Messages adapter: ``anthropic/<model>``.

Settings (see ``settings.py``): ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``,
``SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT``, ``SESSIONFLOW_PROVIDER_READ_TIMEOUT``,
``SESSIONFLOW_MAX_OUTPUT_TOKENS`` (the API requires a limit: default the model table's),
``SESSIONFLOW_ANTHROPIC_THINKING_BUDGET`` (extended thinking), ``SESSIONFLOW_WEB_SEARCH``.

Streams text, thinking with its signature, redacted thinking, tool use with streamed JSON input,
server tool use (web search) with its result block as a provider-executed call, usage with cache
read and write tokens, and stop reasons (stop, tool-calls, length, content-filter). Requests carry
prompt-cache breakpoints.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from activities.providers import base as p
from activities.providers.anthropic_request import messages_body
from activities.providers.anthropic_stream import AnthropicParser
from activities.providers.clients import anthropic_client
from activities.providers.errors import Label
from activities.providers.relay import SdkStream, relay
from activities.providers.settings import ProviderSettings


class AnthropicProvider:
    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    def stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        return self._stream(request)

    async def _stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        label = Label(
            "Anthropic Messages",
            request.model.id,
            base_url=self.settings.anthropic_base_url or "https://api.anthropic.com",
            key_env="ANTHROPIC_API_KEY",
        )
        api_key = self.settings.anthropic_api_key
        if api_key is None:
            raise label.error("auth", "no API key is set.")
        client = anthropic_client(self.settings, api_key=api_key)
        body = messages_body(request, self.settings)

        async def opener() -> SdkStream:
            # The body is built as plain JSON, so the SDK's typed overloads cannot narrow it.
            stream: SdkStream = await client.messages.create(**body, stream=True)
            return stream

        async for event in relay(label, client, opener, AnthropicParser(label)):
            yield event
