"""The OpenAI Responses adapter: ``openai/<model>``.

Settings (see ``settings.py``): ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``SESSIONFLOW_PROVIDER_CONNECT_TIMEOUT``, ``SESSIONFLOW_PROVIDER_READ_TIMEOUT``,
``SESSIONFLOW_MAX_OUTPUT_TOKENS``, ``SESSIONFLOW_REASONING_EFFORT``, ``SESSIONFLOW_WEB_SEARCH``.

Streams text, reasoning summaries (reasoning items keep their id and encrypted content, requested
with ``include``, as replay metadata), function calls, the hosted web search as provider-executed
calls with their sources as results, usage with cached and reasoning tokens, and incomplete
reasons (length, content-filter). Requests are stateless (``store: false``) and carry
``prompt_cache_key``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from activities.providers import base as p
from activities.providers.clients import openai_client
from activities.providers.errors import Label
from activities.providers.openai_responses_request import responses_body
from activities.providers.openai_responses_stream import ResponsesParser
from activities.providers.relay import SdkStream, relay
from activities.providers.settings import ProviderSettings


class OpenAIResponsesProvider:
    def __init__(self, settings: ProviderSettings) -> None:
        self.settings = settings

    def stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        return self._stream(request)

    async def _stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        base_url = self.settings.openai_base_url
        label = Label(
            "OpenAI Responses",
            request.model.id,
            base_url=base_url or "https://api.openai.com/v1",
            key_env="OPENAI_API_KEY",
        )
        api_key = self.settings.openai_api_key
        if api_key is None:
            raise label.error("auth", "no API key is set.")
        client = openai_client(self.settings, api_key=api_key, base_url=base_url)
        body = responses_body(request, self.settings)

        async def opener() -> SdkStream:
            # The body is built as plain JSON, so the SDK's typed overloads cannot narrow it.
            stream: SdkStream = await client.responses.create(**body, stream=True)
            return stream

        async for event in relay(label, client, opener, ResponsesParser(label)):
            yield event
