"""The Anthropic Messages adapter against recorded streams on a local server."""

from __future__ import annotations

from activities.providers import base as p
from tests.activities.providers.server import ReplayServer, Reply, sse
from tests.activities.providers.support import (
    SYSTEM,
    publish,
    recording,
    request,
    run,
    settings,
    user,
)

MODEL = "anthropic/claude-haiku-4-5"
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
RESULTS = [
    {
        "type": "web_search_result",
        "title": "Temporal",
        "url": "https://docs.temporal.io/",
        "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5",
        "page_age": "April 30, 2025",
    }
]
EPHEMERAL = {"type": "ephemeral"}


def event(kind: str, **fields: object) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def block(index: int, content: dict[str, object]) -> bytes:
    return event("content_block_start", index=index, content_block=content)


def delta(index: int, **content: object) -> bytes:
    return event("content_block_delta", index=index, delta=content)


def stop(index: int) -> bytes:
    return event("content_block_stop", index=index)


def finish(reason: str) -> list[bytes]:
    return [
        event("message_delta", delta={"stop_reason": reason}, usage={"output_tokens": 5}),
        event("message_stop"),
    ]


async def test_streams_signed_thinking_redacted_thinking_and_parallel_tool_use(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("anthropic_thinking_tools.sse")))
    outcome = await run(settings(server), request(MODEL))
    assert outcome.error is None
    assert outcome.events == [
        p.ReasoningStart(id="reasoning-1"),
        p.ReasoningDelta(id="reasoning-1", delta="I should echo"),
        p.ReasoningDelta(id="reasoning-1", delta=" both words."),
        p.ReasoningEnd(id="reasoning-1", metadata={"signature": SIGNATURE}),
        p.ReasoningStart(id="reasoning-2"),
        p.ReasoningEnd(id="reasoning-2", metadata={"redactedData": REDACTED}),
        p.TextStart(id="text-3"),
        p.TextDelta(id="text-3", delta="Echoing both."),
        p.TextEnd(id="text-3"),
        p.ToolInputStart(id="toolu_01A", name="echo"),
        p.ToolInputDelta(id="toolu_01A", delta='{"text": "on'),
        p.ToolInputDelta(id="toolu_01A", delta='e"}'),
        p.ToolInputEnd(id="toolu_01A"),
        p.ToolCall(call_id="toolu_01A", name="echo", input='{"text": "one"}'),
        p.ToolInputStart(id="toolu_01B", name="echo"),
        p.ToolInputDelta(id="toolu_01B", delta='{"text": "two"}'),
        p.ToolInputEnd(id="toolu_01B"),
        p.ToolCall(call_id="toolu_01B", name="echo", input='{"text": "two"}'),
        p.StepFinish(
            reason="tool-calls",
            usage=p.Usage(input=1150, output=89, cache_read=1000, cache_write=100),
        ),
    ]
    published = publish(outcome.events, model=MODEL)
    assert [call.call_id for call in published.local_calls] == ["toolu_01A", "toolu_01B"]


async def test_the_first_request_has_system_tools_thinking_and_cache_breakpoints(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("anthropic_thinking_tools.sse")))
    await run(settings(server, anthropic_thinking_budget=2048), request(MODEL))
    sent = server.last()
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    # SDK versions differ in the header that carries the key (x-api-key or a bearer token).
    assert "sk-ant-test" in (sent.headers.get("x-api-key") or sent.headers["authorization"])
    assert sent.json() == {
        "model": "claude-haiku-4-5",
        "max_tokens": 64000,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Say hello.", "cache_control": EPHEMERAL}],
            }
        ],
        "tools": [
            {
                "name": "echo",
                "description": "Return the given text.",
                "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
            }
        ],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "stream": True,
    }


async def test_streams_server_web_search_with_its_result_block(server: ReplayServer) -> None:
    server.queue(Reply.events(*recording("anthropic_web_search.sse")))
    outcome = await run(settings(server, web_search=True), request(MODEL))
    assert outcome.events == [
        p.TextStart(id="text-1"),
        p.TextDelta(id="text-1", delta="Let me search."),
        p.TextEnd(id="text-1"),
        p.ToolInputStart(id="srvtoolu_014", name="web_search"),
        p.ToolInputDelta(id="srvtoolu_014", delta='{"query": "temporal'),
        p.ToolInputDelta(id="srvtoolu_014", delta=' durable execution"}'),
        p.ToolInputEnd(id="srvtoolu_014"),
        p.ToolCall(
            call_id="srvtoolu_014",
            name="web_search",
            input={"query": "temporal durable execution"},
            provider_executed=True,
            metadata={"blockType": "server_tool_use"},
        ),
        p.ToolResult(
            call_id="srvtoolu_014",
            name="web_search",
            result=RESULTS,
            metadata={"blockType": "web_search_tool_result"},
        ),
        p.TextStart(id="text-2"),
        p.TextDelta(id="text-2", delta="Temporal runs durable workflows."),
        p.TextEnd(id="text-2"),
        p.StepFinish(
            reason="stop", usage=p.Usage(input=1150, output=40, cache_read=1000, cache_write=100)
        ),
    ]
    assert server.last().json()["tools"][-1] == {
        "type": "web_search_20250305",
        "name": "web_search",
        "max_uses": 5,
    }
    publish(outcome.events, model=MODEL)


async def test_replays_signed_thinking_and_hosted_results_inline(server: ReplayServer) -> None:
    """Reference §7.2 cases 35 and 36, for the Messages API."""
    history = (
        user("Search, then echo."),
        p.RequestMessage(
            role="assistant",
            content=(
                p.ReasoningPartIn(
                    text="I should search.", provider_metadata={"anthropic": {"signature": "sig_1"}}
                ),
                p.ReasoningPartIn(text="", provider_metadata={"anthropic": {"redactedData": "r"}}),
                p.ToolCallPartIn(
                    call_id="srvtoolu_014",
                    name="web_search",
                    input={"query": "temporal"},
                    provider_executed=True,
                    provider_metadata={"anthropic": {"blockType": "server_tool_use"}},
                ),
                p.ToolResultPartIn(
                    call_id="srvtoolu_014",
                    name="web_search",
                    output=RESULTS,
                    provider_executed=True,
                    provider_metadata={"anthropic": {"blockType": "web_search_tool_result"}},
                ),
                p.TextPartIn(text="Echoing."),
                p.ToolCallPartIn(call_id="toolu_01A", name="echo", input={"text": "one"}),
                p.ToolCallPartIn(call_id="toolu_01B", name="echo", input={"text": "two"}),
            ),
        ),
        p.RequestMessage(
            role="tool",
            content=(p.ToolResultPartIn(call_id="toolu_01A", name="echo", output="one"),),
        ),
        p.RequestMessage(
            role="tool",
            content=(
                p.ToolResultPartIn(call_id="toolu_01B", name="echo", output="no", is_error=True),
            ),
        ),
    )
    server.queue(Reply.events(*recording("anthropic_web_search.sse")))
    await run(settings(server, web_search=True), request(MODEL, *history))
    assert server.last().json()["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Search, then echo."}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should search.", "signature": "sig_1"},
                {"type": "redacted_thinking", "data": "r"},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_014",
                    "name": "web_search",
                    "input": {"query": "temporal"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_014",
                    "content": RESULTS,
                },
                {"type": "text", "text": "Echoing."},
                {"type": "tool_use", "id": "toolu_01A", "name": "echo", "input": {"text": "one"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "echo", "input": {"text": "two"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "one"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "content": "no",
                    "is_error": True,
                    "cache_control": EPHEMERAL,
                },
            ],
        },
    ]


async def test_without_tools_tool_blocks_and_unsigned_thinking_become_text(
    server: ReplayServer,
) -> None:
    history = (
        user("Echo."),
        p.RequestMessage(
            role="assistant",
            content=(
                p.ReasoningPartIn(text="unsigned"),
                p.ToolCallPartIn(call_id="toolu_1", name="echo", input={"text": "a"}),
            ),
        ),
        p.RequestMessage(
            role="tool", content=(p.ToolResultPartIn(call_id="toolu_1", name="echo", output="a"),)
        ),
        p.RequestMessage(role="assistant", content=(p.TextPartIn(text="Summarize now."),)),
    )
    server.queue(Reply.events(*recording("anthropic_web_search.sse")))
    await run(settings(server), request(MODEL, *history, tools=(), tool_choice="none"))
    body = server.last().json()
    assert "tools" not in body and "tool_choice" not in body
    assert body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "unsigned"},
                {"type": "text", "text": '[tool echo called with {"text": "a"}]'},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "[tool echo returned: a]"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Summarize now.", "cache_control": EPHEMERAL}],
        },
    ]


async def test_maps_stop_reasons(server: ReplayServer) -> None:
    cases = [("end_turn", "stop"), ("max_tokens", "length"), ("refusal", "content-filter")]
    for raw, mapped in [*cases, ("pause_turn", "other")]:
        server.queue(Reply.events(block(0, {"type": "text", "text": "a"}), stop(0), *finish(raw)))
        outcome = await run(settings(server), request(MODEL))
        assert outcome.finish.reason == mapped


async def test_an_overloaded_error_event_mid_stream_is_internal(server: ReplayServer) -> None:
    """Catalogue P8: provider errors mid-stream."""
    error = {"type": "overloaded_error", "message": "Overloaded"}
    server.queue(
        Reply.events(
            block(0, {"type": "text", "text": ""}),
            delta(0, type="text_delta", text="Hal"),
            event("error", error=error),
        )
    )
    outcome = await run(settings(server), request(MODEL))
    assert [type(e) for e in outcome.events] == [p.TextStart, p.TextDelta]
    assert outcome.error is not None
    assert (outcome.error.kind, outcome.error.status) == ("internal", None)
    assert "claude-haiku-4-5" in outcome.error.message and "Overloaded" in outcome.error.message
