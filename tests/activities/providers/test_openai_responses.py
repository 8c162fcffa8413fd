"""The Responses adapter against recorded streams on a local server."""

from __future__ import annotations

from activities.providers import base as p
from tests.activities.providers.server import ReplayServer, Reply, sse
from tests.activities.providers.support import (
    CACHE_KEY,
    SYSTEM,
    publish,
    recording,
    request,
    run,
    settings,
    user,
)

MODEL = "openai/gpt-5"
ECHO_TOOL = {
    "type": "function",
    "name": "echo",
    "description": "Return the given text.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    "strict": False,
}
REASONING_STATE = {
    "itemId": "rs_68a1",
    "reasoningEncryptedContent": "gAAAAABoq-encrypted-reasoning-1==",
}
SEARCH_ACTION = {"type": "search", "query": "temporal durable execution"}
SOURCES = [{"type": "url", "url": "https://docs.temporal.io/"}]


def event(kind: str, **fields: object) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def completed(**response: object) -> bytes:
    return event("response.completed", response={"status": "completed", **response})


async def test_streams_encrypted_reasoning_and_parallel_function_calls(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("responses_reasoning_tools.sse")))
    outcome = await run(settings(server), request(MODEL))
    assert outcome.error is None
    assert outcome.events == [
        p.ReasoningStart(id="reasoning-1", metadata={"itemId": "rs_68a1"}),
        p.ReasoningDelta(id="reasoning-1", delta="**Planning**\n\n"),
        p.ReasoningDelta(id="reasoning-1", delta="Echo both words."),
        p.ReasoningDelta(id="reasoning-1", delta="\n\n"),
        p.ReasoningDelta(id="reasoning-1", delta="Call the tool twice."),
        p.ReasoningEnd(id="reasoning-1", metadata=REASONING_STATE),
        p.ToolInputStart(id="call_one", name="echo"),
        p.ToolInputDelta(id="call_one", delta='{"tex'),
        p.ToolInputDelta(id="call_one", delta='t": "one"}'),
        p.ToolInputEnd(id="call_one"),
        p.ToolCall(
            call_id="call_one", name="echo", input='{"text": "one"}', metadata={"itemId": "fc_68a2"}
        ),
        p.ToolInputStart(id="call_two", name="echo"),
        p.ToolInputDelta(id="call_two", delta='{"tex'),
        p.ToolInputDelta(id="call_two", delta='t": "two"}'),
        p.ToolInputEnd(id="call_two"),
        p.ToolCall(
            call_id="call_two", name="echo", input='{"text": "two"}', metadata={"itemId": "fc_68a3"}
        ),
        p.StepFinish(
            reason="tool-calls",
            usage=p.Usage(input=120, output=48, reasoning=32, cache_read=64),
        ),
    ]
    published = publish(outcome.events, model=MODEL)
    assert [call.call_id for call in published.local_calls] == ["call_one", "call_two"]


async def test_the_first_request_asks_for_encrypted_reasoning_statelessly(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("responses_reasoning_tools.sse")))
    await run(settings(server, reasoning_effort="low"), request(MODEL))
    sent = server.last()
    assert (sent.method, sent.path) == ("POST", "/v1/responses")
    assert sent.json() == {
        "model": "gpt-5",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
        "instructions": SYSTEM,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto", "effort": "low"},
        "tools": [ECHO_TOOL],
        "prompt_cache_key": CACHE_KEY,
        "stream": True,
    }


async def test_a_non_reasoning_model_gets_no_reasoning_options(server: ReplayServer) -> None:
    server.queue(Reply.events(*recording("responses_web_search.sse")))
    await run(settings(server, web_search=True), request("openai/gpt-4.1", tools=()))
    body = server.last().json()
    assert "reasoning" not in body and "include" not in body
    assert body["tools"] == [{"type": "web_search"}]


async def test_streams_hosted_web_search_as_a_provider_executed_call_with_result(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("responses_web_search.sse")))
    outcome = await run(settings(server, web_search=True), request(MODEL))
    state = {"itemId": "ws_68b1"}
    assert outcome.events == [
        p.ToolInputStart(id="ws_68b1", name="web_search"),
        p.ToolInputEnd(id="ws_68b1"),
        p.ToolCall(
            call_id="ws_68b1",
            name="web_search",
            input=SEARCH_ACTION,
            provider_executed=True,
            metadata=state,
        ),
        p.ToolResult(
            call_id="ws_68b1",
            name="web_search",
            result={"status": "completed", "sources": SOURCES},
            metadata=state,
        ),
        p.TextStart(id="text-1"),
        p.TextDelta(id="text-1", delta="Temporal runs "),
        p.TextDelta(id="text-1", delta="durable workflows."),
        p.TextEnd(id="text-1"),
        p.StepFinish(reason="stop", usage=p.Usage(input=300, output=20)),
    ]
    publish(outcome.events, model=MODEL)


async def test_replays_reasoning_items_and_hosted_search_inline(server: ReplayServer) -> None:
    """Reference §7.2 cases 35 and 36, for the Responses API."""
    history = (
        user("Search, then echo."),
        p.RequestMessage(
            role="assistant",
            content=(
                p.ReasoningPartIn(
                    text="**Planning**\n\nEcho both words.",
                    provider_metadata={"openai": REASONING_STATE},
                ),
                p.ToolCallPartIn(
                    call_id="ws_68b1",
                    name="web_search",
                    input=SEARCH_ACTION,
                    provider_executed=True,
                    provider_metadata={"openai": {"itemId": "ws_68b1"}},
                ),
                p.ToolResultPartIn(
                    call_id="ws_68b1",
                    name="web_search",
                    output={"status": "completed", "sources": SOURCES},
                    provider_executed=True,
                    provider_metadata={"openai": {"itemId": "ws_68b1"}},
                ),
                p.TextPartIn(text="Found it."),
                p.ToolCallPartIn(
                    call_id="call_one",
                    name="echo",
                    input={"text": "one"},
                    provider_metadata={"openai": {"itemId": "fc_68a2"}},
                ),
            ),
        ),
        p.RequestMessage(
            role="tool",
            content=(p.ToolResultPartIn(call_id="call_one", name="echo", output="one"),),
        ),
    )
    server.queue(Reply.events(*recording("responses_web_search.sse")))
    await run(settings(server), request(MODEL, *history))
    assert server.last().json()["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Search, then echo."}]},
        {
            "type": "reasoning",
            "id": "rs_68a1",
            "summary": [{"type": "summary_text", "text": "**Planning**\n\nEcho both words."}],
            "encrypted_content": "gAAAAABoq-encrypted-reasoning-1==",
        },
        {
            "type": "web_search_call",
            "id": "ws_68b1",
            "status": "completed",
            "action": {**SEARCH_ACTION, "sources": SOURCES},
        },
        {"role": "assistant", "content": "Found it."},
        {
            "type": "function_call",
            "call_id": "call_one",
            "name": "echo",
            "arguments": '{"text": "one"}',
        },
        {"type": "function_call_output", "call_id": "call_one", "output": "one"},
    ]


async def test_parts_without_this_providers_metadata_replay_as_text(server: ReplayServer) -> None:
    history = (
        user("Hi"),
        p.RequestMessage(
            role="assistant",
            content=(
                p.ReasoningPartIn(text="thought without state"),
                p.ReasoningPartIn(text="", provider_metadata={"anthropic": {"signature": "s"}}),
                p.ToolCallPartIn(
                    call_id="srv_1", name="web_search", input={"query": "q"}, provider_executed=True
                ),
                p.ToolResultPartIn(
                    call_id="srv_1",
                    name="web_search",
                    output="timeout",
                    is_error=True,
                    provider_executed=True,
                ),
            ),
        ),
    )
    server.queue(Reply.events(*recording("responses_web_search.sse")))
    await run(settings(server), request(MODEL, *history))
    assert server.last().json()["input"][1] == {
        "role": "assistant",
        "content": "thought without state\n\n"
        '[provider tool web_search called with {"query": "q"}]\n\n'
        "[provider tool web_search failed: timeout]",
    }


async def test_incomplete_responses_end_with_their_reason(server: ReplayServer) -> None:
    for reason, mapped in [("max_output_tokens", "length"), ("content_filter", "content-filter")]:
        server.queue(
            Reply.events(
                event(
                    "response.incomplete",
                    response={"status": "incomplete", "incomplete_details": {"reason": reason}},
                )
            )
        )
        outcome = await run(settings(server), request(MODEL))
        assert outcome.finish.reason == mapped


async def test_a_server_sending_only_finished_items_still_streams_them(
    server: ReplayServer,
) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "content": [{"type": "output_text", "text": "Done."}],
    }
    server.queue(
        Reply.events(
            event("response.output_item.done", output_index=0, item=message),
            completed(usage={"input_tokens": 3, "output_tokens": 1}),
        )
    )
    outcome = await run(settings(server), request(MODEL))
    assert outcome.events == [
        p.TextStart(id="text-1"),
        p.TextDelta(id="text-1", delta="Done."),
        p.TextEnd(id="text-1"),
        p.StepFinish(reason="stop", usage=p.Usage(input=3, output=1)),
    ]


async def test_failed_responses_and_error_events_raise_classified_errors(
    server: ReplayServer,
) -> None:
    failed = {"status": "failed", "error": {"code": "rate_limit_exceeded", "message": "Slow down"}}
    server.queue(Reply.events(event("response.failed", response=failed)))
    outcome = await run(settings(server), request(MODEL))
    assert outcome.error is not None and outcome.error.kind == "rate_limit"
    assert "gpt-5" in outcome.error.message and "Slow down" in outcome.error.message

    server.queue(
        Reply.events(event("error", code="context_length_exceeded", message="Too long", param=None))
    )
    outcome = await run(settings(server), request(MODEL))
    assert outcome.error is not None and outcome.error.kind == "context_overflow"
