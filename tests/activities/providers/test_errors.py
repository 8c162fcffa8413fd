"""HTTP statuses, error bodies and broken connections mapped to the taxonomy, per adapter."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import pytest

from activities.providers import base as p
from activities.providers.errors import classify, retry_after_ms
from tests.activities.providers.server import ReplayServer, Reply
from tests.activities.providers.support import recording, request, run, settings

MODELS = {
    "openai-chat": "openai-chat/gpt-4o-mini",
    "openai": "openai/gpt-5",
    "anthropic": "anthropic/claude-haiku-4-5",
}
STREAMS = {
    "openai-chat": "chat_text.sse",
    "openai": "responses_web_search.sse",
    "anthropic": "anthropic_web_search.sse",
}
ADAPTERS = list(MODELS)


@dataclass
class Case:
    status: int
    type: str
    message: str
    kind: str
    code: str | None = None
    headers: dict[str, str] | None = None

    def body(self, adapter: str) -> dict[str, Any]:
        if adapter == "anthropic":
            return {"type": "error", "error": {"type": self.type, "message": self.message}}
        error = {"message": self.message, "type": self.type, "param": None, "code": self.code}
        return {"error": error}


CASES = {
    "400 invalid request": Case(
        400, "invalid_request_error", "Unknown parameter", "invalid_request"
    ),
    "400 context overflow": Case(
        400,
        "invalid_request_error",
        "prompt is too long: 210000 tokens > 200000 maximum",
        "context_overflow",
        code="context_length_exceeded",
    ),
    "400 content filter": Case(
        400,
        "invalid_request_error",
        "The prompt was blocked by the content filtering policy.",
        "content_filter",
        code="content_filter",
    ),
    "400 credit balance": Case(
        400,
        "invalid_request_error",
        "Your credit balance is too low to access the API.",
        "quota",
    ),
    "401 auth": Case(401, "authentication_error", "invalid x-api-key", "auth"),
    "403 permission": Case(403, "permission_error", "Not allowed", "auth"),
    "404 model": Case(404, "not_found_error", "model: gpt-9", "invalid_request"),
    "408 timeout": Case(408, "timeout_error", "Request timed out", "transport"),
    "413 too large": Case(
        413, "request_too_large", "Request exceeds the size limit", "invalid_request"
    ),
    "429 quota": Case(
        429,
        "insufficient_quota",
        "You exceeded your current quota, please check your plan.",
        "quota",
        code="insufficient_quota",
    ),
    "429 rate limit": Case(
        429,
        "rate_limit_error",
        "Rate limit reached",
        "rate_limit",
        headers={"retry-after": "3"},
    ),
    "500 internal": Case(500, "api_error", "Internal server error", "internal"),
    "503 unavailable": Case(503, "server_error", "Service unavailable", "internal"),
    "529 overloaded": Case(529, "overloaded_error", "Overloaded", "internal"),
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("name", list(CASES))
async def test_each_error_status_maps_to_its_kind(
    server: ReplayServer, adapter: str, name: str
) -> None:
    case = CASES[name]
    server.queue(Reply.error(case.status, case.body(adapter), **(case.headers or {})))
    outcome = await run(settings(server), request(MODELS[adapter]))
    assert outcome.events == []
    error = outcome.error
    assert error is not None
    assert (error.kind, error.status) == (case.kind, case.status)
    model = MODELS[adapter].split("/", 1)[1]
    assert model in error.message and f"HTTP {case.status}" in error.message
    assert case.message.split(":")[0] in error.message
    if case.headers:
        assert error.retry_after_ms == 3000
    assert len(server.requests) == 1  # the SDK's own retries are off


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_gateway_html_page_is_an_internal_error(server: ReplayServer, adapter: str) -> None:
    server.queue(Reply(status=502, chunks=[b"<html>Bad Gateway</html>"], content_type="text/html"))
    outcome = await run(settings(server), request(MODELS[adapter]))
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.status) == ("internal", 502)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_refused_connection_is_transport(server: ReplayServer, adapter: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    dead = settings(server, openai_base_url=f"{closed}/v1", anthropic_base_url=closed)
    outcome = await run(dead, request(MODELS[adapter]))
    assert outcome.error is not None
    assert outcome.error.kind == "transport"
    assert closed in outcome.error.message  # the hint names the base URL to check


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("breakage", ["reset", "cut", "clean end"])
async def test_a_stream_broken_midway_is_transport_after_its_partial_events(
    server: ReplayServer, adapter: str, breakage: str
) -> None:
    """Catalogue P4: a truncated stream."""
    events = recording(STREAMS[adapter])
    half = events[: len(events) // 2]
    server.queue(
        Reply.events(*half, reset=breakage == "reset", cut=breakage == "cut"),
    )
    outcome = await run(settings(server), request(MODELS[adapter]))
    assert outcome.error is not None
    assert outcome.error.kind == "transport"
    assert outcome.error.retryable
    assert not outcome.of(p.StepFinish)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_silent_stream_times_out_as_transport(server: ReplayServer, adapter: str) -> None:
    events = recording(STREAMS[adapter])
    server.queue(Reply.events(*events, stall=1.0))
    outcome = await run(settings(server, read_timeout_s=0.2), request(MODELS[adapter]))
    assert outcome.error is not None and outcome.error.kind == "transport"


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_missing_api_key_fails_before_any_request(
    server: ReplayServer, adapter: str
) -> None:
    keyless = settings(server, openai_api_key=None, anthropic_api_key=None)
    outcome = await run(keyless, request(MODELS[adapter]))
    assert outcome.error is not None and outcome.error.kind == "auth"
    assert "API_KEY" in outcome.error.message
    assert server.requests == []


def test_retry_after_reads_milliseconds_seconds_and_dates() -> None:
    assert retry_after_ms({"retry-after-ms": "1500"}) == 1500
    assert retry_after_ms({"retry-after": "2.5"}) == 2500
    assert retry_after_ms({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0
    assert retry_after_ms({"retry-after": "soon"}) is None
    assert retry_after_ms({"retry-after": "99999"}) == 600_000  # capped
    assert retry_after_ms({}) is None


def test_classify_covers_the_taxonomy_without_a_status() -> None:
    assert classify(None, "server_error", None, "The server had an error") == "internal"
    assert classify(None, "error", "rate_limit_exceeded", "slow down") == "rate_limit"
    assert classify(None, None, None, "something odd") == "unknown"
    assert classify(409, None, None, "conflict") == "internal"
