"""SDK clients as the adapters use them: retries off (the drain owns retries), our timeouts, and
a bound on each server-sent event.

A client is made per stream and closed with it: activities may run on different event loops
(tests, worker restarts), and an async HTTP pool must not outlive its loop.

The SDKs' event decoders hold an event whole until its blank line, whatever its size: one
enormous event (a Responses ``output_item.done`` repeats a call's whole arguments) would sit in
memory before any cap of ours could look at it. The transport counts each event's bytes as
they arrive and ends the stream with ``OversizedEventError`` past ``MAX_EVENT_BYTES``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import httpx2
import openai

from activities.providers.errors import OversizedEventError
from activities.providers.settings import ProviderSettings

# Far above any event a model sends (tool input is capped at 1 MiB, a whole long answer repeated
# in a closing event is a few MiB), far below what would hurt a worker.
MAX_EVENT_BYTES = 8 * 2**20
_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


class _BoundedEvents(httpx2.AsyncByteStream):
    """A response body passed on as it arrives, each event (up to a blank line) at most
    ``limit`` bytes."""

    def __init__(self, body: httpx2.AsyncByteStream, limit: int) -> None:
        self._body = body
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        since_boundary, tail = 0, b""
        async for chunk in self._body:
            window = tail + chunk
            ends = [window.rfind(b) + len(b) for b in _BOUNDARIES if b in window]
            since_boundary = len(window) - max(ends) if ends else since_boundary + len(chunk)
            if since_boundary > self._limit:
                raise OversizedEventError(self._limit)
            tail = window[-3:]
            yield chunk

    async def aclose(self) -> None:
        await self._body.aclose()


class _BoundedTransport(httpx2.AsyncHTTPTransport):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(
            response.status_code,
            headers=response.headers,
            stream=_BoundedEvents(response.stream, self._limit),
            extensions=response.extensions,
        )


def openai_client(
    settings: ProviderSettings, *, api_key: str, base_url: str | None
) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        max_retries=0,
        timeout=openai.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
        http_client=openai.DefaultAsyncHttpxClient(transport=_BoundedTransport(MAX_EVENT_BYTES)),
    )


def anthropic_client(settings: ProviderSettings, *, api_key: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        api_key=api_key,
        base_url=settings.anthropic_base_url,
        max_retries=0,
        timeout=anthropic.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
        http_client=anthropic.DefaultAsyncHttpxClient(transport=_BoundedTransport(MAX_EVENT_BYTES)),
    )
