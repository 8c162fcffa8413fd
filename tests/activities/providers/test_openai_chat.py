"""The Chat Completions adapter against recorded streams on a local server."""

from __future__ import annotations

import json

from activities.providers import base as p
from sessionflow.models import events as ev
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

MODEL = "openai-chat/gpt-4o-mini"
ECHO_TOOL = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Return the given text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})


async def test_streams_text_and_usage_and_sends_the_exact_request(server: ReplayServer) -> None:
    server.queue(Reply.events(*recording("chat_text.sse")))
    outcome = await run(settings(server), request(MODEL))
    assert outcome.error is None
    assert outcome.events == [
        p.TextStart(id="text-1"),
        p.TextDelta(id="text-1", delta="Hello"),
        p.TextDelta(id="text-1", delta=", world."),
        p.TextEnd(id="text-1"),
        p.StepFinish(reason="stop", usage=p.Usage(input=25, output=4, cache_read=16)),
    ]
    sent = server.last()
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.json() == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Say hello."},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [ECHO_TOOL],
        "prompt_cache_key": CACHE_KEY,
    }


async def test_assembles_parallel_tool_calls_from_indexed_argument_deltas(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("chat_parallel_tools.sse")))
    outcome = await run(settings(server), request(MODEL))
    assert outcome.events == [
        p.ToolInputStart(id="call_abc", name="echo"),
        p.ToolInputDelta(id="call_abc", delta='{"te'),
        p.ToolInputDelta(id="call_abc", delta='xt": "one"}'),
        p.ToolInputStart(id="call_def", name="echo"),
        p.ToolInputDelta(id="call_def", delta='{"text": "two"}'),
        p.ToolInputEnd(id="call_abc"),
        p.ToolCall(call_id="call_abc", name="echo", input='{"text": "one"}'),
        p.ToolInputEnd(id="call_def"),
        p.ToolCall(call_id="call_def", name="echo", input='{"text": "two"}'),
        p.StepFinish(reason="tool-calls", usage=p.Usage(input=80, output=30)),
    ]
    published = publish(outcome.events)
    assert [call.call_id for call in published.local_calls] == ["call_abc", "call_def"]


async def test_streams_reasoning_content_before_the_answer(server: ReplayServer) -> None:
    server.queue(Reply.events(*recording("chat_reasoning.sse")))
    outcome = await run(settings(server), request("openai-chat/deepseek-reasoner"))
    assert outcome.events == [
        p.ReasoningStart(id="reasoning-1"),
        p.ReasoningDelta(id="reasoning-1", delta="The user greets"),
        p.ReasoningDelta(id="reasoning-1", delta="; answer briefly."),
        p.ReasoningEnd(id="reasoning-1"),
        p.TextStart(id="text-2"),
        p.TextDelta(id="text-2", delta="Hi!"),
        p.TextEnd(id="text-2"),
        p.StepFinish(reason="stop", usage=p.Usage(input=12, output=20, reasoning=17)),
    ]
    publish(outcome.events)


async def test_replays_history_with_tool_calls_results_and_images(server: ReplayServer) -> None:
    image = p.ImagePartIn(media_type="image/png", data="iVBORw0KGgo=", filename="dot.png")
    history = (
        user("Echo twice, then look at this.", image),
        p.RequestMessage(
            role="assistant",
            content=(
                p.ReasoningPartIn(text="private", provider_metadata=None),
                p.TextPartIn(text="Echoing."),
                p.ToolCallPartIn(call_id="call_abc", name="echo", input={"text": "one"}),
                p.ToolCallPartIn(call_id="call_def", name="echo", input='{"text": "two"}'),
                p.ToolCallPartIn(
                    call_id="ws_1",
                    name="web_search",
                    input={"query": "q"},
                    provider_executed=True,
                ),
                p.ToolResultPartIn(
                    call_id="ws_1", name="web_search", output={"n": 1}, provider_executed=True
                ),
            ),
        ),
        p.RequestMessage(
            role="tool",
            content=(p.ToolResultPartIn(call_id="call_abc", name="echo", output="one"),),
        ),
        p.RequestMessage(
            role="tool",
            content=(
                p.ToolResultPartIn(call_id="call_def", name="echo", output="boom", is_error=True),
            ),
        ),
        p.RequestMessage(role="system", content=(p.TextPartIn(text="Context changed."),)),
    )
    server.queue(Reply.events(*recording("chat_text.sse")))
    await run(settings(server), request(MODEL, *history))
    assert server.last().json()["messages"] == [
        {"role": "system", "content": SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Echo twice, then look at this."},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {
            "role": "assistant",
            "content": "Echoing.\n\n[provider tool web_search called with "
            '{"query": "q"}]\n\n[provider tool web_search returned: {"n": 1}]',
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "one"}'},
                },
                {
                    "id": "call_def",
                    "type": "function",
                    "function": {"name": "echo", "arguments": '{"text": "two"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_abc", "content": "one"},
        {"role": "tool", "tool_call_id": "call_def", "content": "boom"},
        {"role": "system", "content": "Context changed."},
    ]


async def test_a_compatible_server_gets_its_own_url_key_and_output_limit(
    server: ReplayServer,
) -> None:
    server.queue(Reply.events(*recording("chat_text.sse")))
    compatible = settings(
        server,
        openai_api_key=None,
        chat_base_url=f"{server.url}/compat/v1",
        max_output_tokens=512,
    )
    await run(compatible, request("openai-chat/llama3.1", tools=(), tool_choice="none"))
    sent = server.last()
    assert sent.path == "/compat/v1/chat/completions"
    assert sent.headers["authorization"].startswith("Bearer sessionflow-")
    body = sent.json()
    assert body["max_tokens"] == 512
    assert "tools" not in body and "tool_choice" not in body  # none without tools is rejected


async def test_tolerates_servers_without_call_ids_or_with_late_names(
    server: ReplayServer,
) -> None:
    server.queue(
        Reply.events(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"text":'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"name": "echo"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}),
            chunk({}, "stop"),
            sse("[DONE]"),
        )
    )
    outcome = await run(settings(server), request(MODEL))
    assert outcome.of(p.ToolCall) == [
        p.ToolCall(call_id="call_0", name="echo", input='{"text": "x"}')
    ]
    assert outcome.finish.reason == "tool-calls"  # the server said "stop" after calling a tool
    publish(outcome.events)


async def test_maps_finish_reasons(server: ReplayServer) -> None:
    for raw, mapped in [("length", "length"), ("content_filter", "content-filter"), ("x", "other")]:
        server.queue(Reply.events(chunk({"content": "a"}), chunk({}, raw), sse("[DONE]")))
        outcome = await run(settings(server), request(MODEL))
        assert outcome.finish.reason == mapped


async def test_a_tool_call_cut_by_the_length_limit_is_rejected_as_malformed_json(
    server: ReplayServer,
) -> None:
    """Catalogue P4: a truncated stream."""
    call = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": '{"text": "a'}}
    server.queue(Reply.events(chunk({"tool_calls": [call]}), chunk({}, "length")))
    outcome = await run(settings(server), request(MODEL))
    published = publish(outcome.events)
    failed = [e for e in published.take() if isinstance(e, ev.ToolFailed)]
    assert [e.error.type for e in failed] == ["tool.input-json"]
    assert json.dumps(outcome.finish.reason) == '"length"'
