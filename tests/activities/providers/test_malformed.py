"""Hostile streams (reliability catalogue P1-P7): typed errors or events the publisher accepts."""

from __future__ import annotations

import json
import logging
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from activities.providers import base as p
from activities.providers.assembly import MAX_TOOL_INPUT_BYTES
from activities.providers.clients import MAX_EVENT_BYTES
from sessionflow.models import events as ev
from tests.activities.providers.server import ReplayServer, Reply, sse
from tests.activities.providers.support import publish, publishable, request, run, settings

ANTHROPIC = "anthropic/claude-haiku-4-5"
CHAT = "openai-chat/gpt-4o-mini"
RESPONSES = "openai/gpt-5"


def a(kind: str, **fields: object) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def tool_use(index: int, call_id: str, kind: str = "tool_use") -> bytes:
    block = {"type": kind, "id": call_id, "name": "echo", "input": {}}
    return a("content_block_start", index=index, content_block=block)


def json_delta(index: int, text: str) -> bytes:
    return a(
        "content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": text}
    )


def text_block(index: int, text: str) -> list[bytes]:
    return [
        a("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        a("content_block_delta", index=index, delta={"type": "text_delta", "text": text}),
    ]


END = [a("message_delta", delta={"stop_reason": "end_turn"}, usage={}), a("message_stop")]


def chat(delta: dict[str, object], finish: str | None = None) -> bytes:
    return sse({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def failed_inputs(events: list[object]) -> list[str]:
    """Call ids the publisher rejected as malformed tool input."""
    queued = publish(events).take()
    return [
        e.call_id
        for e in queued
        if isinstance(e, ev.ToolFailed) and e.error.type == "tool.input-json"
    ]


async def test_a_result_for_a_call_never_made_is_a_protocol_error(server: ReplayServer) -> None:
    """P1: no orphan result reaches the publisher."""
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_x", "content": []}
    server.queue(
        Reply.events(*text_block(0, "hi"), a("content_block_start", index=1, content_block=result))
    )
    outcome = await run(settings(server), request(ANTHROPIC))
    assert outcome.error is not None
    assert outcome.error.kind == "invalid_output"
    assert "Tool result before call: srvtoolu_x" in outcome.error.message
    assert not outcome.of(p.ToolResult)


async def test_tool_input_for_a_call_never_opened_is_dropped_by_chat_and_responses(
    server: ReplayServer, caplog: pytest.LogCaptureFixture
) -> None:
    """P1 on the OpenAI adapters, which have no hosted results to orphan: tool input for a call
    that was never opened (Chat: argument pieces at an index that never names its call;
    Responses: argument deltas for an item never added) comes out as no tool event at all, is
    logged, and the turn's text goes on to a clean finish that the publisher accepts."""
    orphan = {"index": 3, "function": {"arguments": '{"text": "ghost"}'}}
    server.queue(
        Reply.events(chat({"tool_calls": [orphan]}), chat({"content": "hi"}), chat({}, "stop"))
    )
    with caplog.at_level(logging.WARNING, logger="activities.providers"):
        chat_outcome = await run(settings(server), request(CHAT))
    assert "never named their tool" in caplog.text
    caplog.clear()
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    server.queue(
        Reply.events(
            a("response.function_call_arguments.delta", item_id="fc_ghost", delta='{"a"'),
            a("response.function_call_arguments.delta", item_id="fc_ghost", delta=": 1}"),
            a("response.output_item.added", output_index=0, item=message),
            a("response.output_text.delta", item_id="msg_1", delta="hi"),
            a("response.output_item.done", output_index=0, item=message),
            a("response.completed", response={"status": "completed"}),
        )
    )
    with caplog.at_level(logging.WARNING, logger="activities.providers"):
        responses_outcome = await run(settings(server), request(RESPONSES))
    assert "tool input for a block that is not open" in caplog.text
    for outcome in (chat_outcome, responses_outcome):
        assert outcome.error is None
        assert [type(e) for e in outcome.events] == [
            p.TextStart,
            p.TextDelta,
            p.TextEnd,
            p.StepFinish,
        ]
        assert outcome.finish.reason == "stop"
        assert publishable(outcome.events)


async def test_duplicate_call_ids_are_called_once(server: ReplayServer) -> None:
    """P2: the second call with a known id is dropped, deterministically."""
    server.queue(
        Reply.events(
            tool_use(0, "toolu_1"),
            json_delta(0, '{"text": "a"}'),
            a("content_block_stop", index=0),
            tool_use(1, "toolu_1"),
            json_delta(1, '{"text": "b"}'),
            a("content_block_stop", index=1),
            *END,
        )
    )
    outcome = await run(settings(server), request(ANTHROPIC))
    assert outcome.of(p.ToolCall) == [
        p.ToolCall(call_id="toolu_1", name="echo", input='{"text": "a"}')
    ]
    assert len(publish(outcome.events).local_calls) == 1


async def test_duplicate_call_ids_in_chat_and_responses_are_called_once(
    server: ReplayServer,
) -> None:
    """Catalogue P2: a duplicate call id."""
    first = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": "{}"}}
    second = {"index": 1, "id": "call_1", "function": {"name": "echo", "arguments": "{}"}}
    server.queue(
        Reply.events(chat({"tool_calls": [first]}), chat({"tool_calls": [second]}, "tool_calls"))
    )
    outcome = await run(settings(server), request(CHAT))
    assert [call.call_id for call in outcome.of(p.ToolCall)] == ["call_1"]

    item = {"type": "function_call", "call_id": "call_1", "name": "echo", "arguments": "{}"}
    server.queue(
        Reply.events(
            a("response.output_item.done", output_index=0, item={**item, "id": "fc_1"}),
            a("response.output_item.done", output_index=1, item={**item, "id": "fc_2"}),
            a("response.completed", response={"status": "completed"}),
        )
    )
    outcome = await run(settings(server), request(RESPONSES))
    assert [call.call_id for call in outcome.of(p.ToolCall)] == ["call_1"]
    publish(outcome.events)


async def test_out_of_order_blocks_are_assembled_or_dropped(server: ReplayServer) -> None:
    """P7: deltas for blocks never opened are dropped; a second text start closes the first."""
    server.queue(
        Reply.events(
            a("content_block_delta", index=5, delta={"type": "text_delta", "text": "lost"}),
            json_delta(6, '{"x": 1}'),
            a("content_block_stop", index=7),
            *text_block(0, "one"),
            *text_block(1, "two"),  # index 0 never stopped
            a("content_block_delta", index=0, delta={"type": "text_delta", "text": "late"}),
            a("content_block_start", index=1, content_block={"type": "text", "text": ""}),
            a("content_block_stop", index=1),
            *END,
        )
    )
    outcome = await run(settings(server), request(ANTHROPIC))
    assert outcome.error is None
    assert outcome.events[:-1] == [
        p.TextStart(id="text-1"),
        p.TextDelta(id="text-1", delta="one"),
        p.TextEnd(id="text-1"),
        p.TextStart(id="text-2"),
        p.TextDelta(id="text-2", delta="two"),
        p.TextEnd(id="text-2"),
    ]
    publish(outcome.events)


async def test_a_stream_cut_inside_a_tool_block_calls_nothing(server: ReplayServer) -> None:
    """P4: no tool starts until its argument block closed."""
    server.queue(Reply.events(tool_use(0, "toolu_1"), json_delta(0, '{"text": "a"}'), reset=True))
    outcome = await run(settings(server), request(ANTHROPIC))
    assert outcome.error is not None and outcome.error.kind == "transport"
    assert not outcome.of(p.ToolCall)
    published = publish(outcome.events)
    assert published.local_calls == []


@pytest.mark.parametrize(
    "arguments",
    [
        '{"text": "never closes',
        '{"text": "\\q invalid escape"}',
        '{"text": NaN}',
        "[" * 10_000 + "]" * 10_000,
        '["not", "an", "object"]',
    ],
    ids=["unclosed", "bad-escape", "nan", "deep", "array"],
)
async def test_malformed_arguments_become_a_tool_error_the_model_reads(
    server: ReplayServer, arguments: str
) -> None:
    """P5: rejected with an error result, never executed."""
    call = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": arguments}}
    server.queue(Reply.events(chat({"tool_calls": [call]}), chat({}, "tool_calls")))
    started = time.monotonic()
    outcome = await run(settings(server), request(CHAT))
    assert failed_inputs(outcome.events) == ["call_1"]
    assert time.monotonic() - started < 1.0


async def test_enormous_arguments_are_capped_not_buffered(server: ReplayServer) -> None:
    """P5: a 3 MB argument stream stops streaming at the cap and is rejected."""
    piece = "x" * 256 * 1024
    events = [tool_use(0, "toolu_big"), json_delta(0, '{"text": "')]
    events += [json_delta(0, piece) for _ in range(12)]
    events += [json_delta(0, '"}'), a("content_block_stop", index=0), *END]
    server.queue(Reply.events(*events))
    started = time.monotonic()
    outcome = await run(settings(server), request(ANTHROPIC))
    assert time.monotonic() - started < 2.0
    streamed = sum(len(e.delta) for e in outcome.of(p.ToolInputDelta))
    assert streamed <= MAX_TOOL_INPUT_BYTES
    assert outcome.of(p.ToolCall)[0].input is None
    assert failed_inputs(outcome.events) == ["toolu_big"]


DUPLICATES = [
    '{"text": "a", "text": "b"}',
    '{"text": "a", "options": {"mode": "x", "mode": "y"}}',
    '{"text": "a", "items": [{"k": 1, "k": 1}]}',
]


@pytest.mark.parametrize("arguments", DUPLICATES, ids=["top", "nested", "in-array"])
async def test_duplicate_argument_keys_are_an_error_on_every_adapter(
    server: ReplayServer, arguments: str
) -> None:
    """P5: a repeated key, at any depth, even with equal values, is malformed input on the
    Chat, Responses and Anthropic adapters alike: an error result the model reads, never run.
    Parsers disagree on which copy wins (first, last, or an error), so no reading is safe."""
    call = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": arguments}}
    server.queue(Reply.events(chat({"tool_calls": [call]}), chat({}, "tool_calls")))
    chat_outcome = await run(settings(server), request(CHAT))
    item = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "echo"}
    server.queue(
        Reply.events(
            a("response.output_item.added", output_index=0, item={**item, "arguments": ""}),
            a("response.function_call_arguments.delta", item_id="fc_1", delta=arguments),
            a("response.output_item.done", output_index=0, item={**item, "arguments": arguments}),
            a("response.completed", response={"status": "completed"}),
        )
    )
    responses_outcome = await run(settings(server), request(RESPONSES))
    half = len(arguments) // 2
    server.queue(
        Reply.events(
            tool_use(0, "call_1"),
            json_delta(0, arguments[:half]),
            json_delta(0, arguments[half:]),
            a("content_block_stop", index=0),
            *END,
        )
    )
    anthropic_outcome = await run(settings(server), request(ANTHROPIC))
    for outcome in (chat_outcome, responses_outcome, anthropic_outcome):
        assert outcome.error is None
        assert outcome.of(p.ToolCall)[0].input == arguments  # the raw text, judged once
        assert failed_inputs(outcome.events) == ["call_1"]
        assert publish(outcome.events).local_calls == []


async def test_the_same_key_in_sibling_objects_is_no_duplicate(server: ReplayServer) -> None:
    """P5: only a key repeated within one object is rejected."""
    arguments = '{"text": "a", "items": [{"text": 1}, {"text": 2}]}'
    call = {"index": 0, "id": "call_1", "function": {"name": "echo", "arguments": arguments}}
    server.queue(Reply.events(chat({"tool_calls": [call]}), chat({}, "tool_calls")))
    outcome = await run(settings(server), request(CHAT))
    published = publish(outcome.events)
    assert [call.call_id for call in published.local_calls] == ["call_1"]


@contextmanager
def _peak_allocations() -> Iterator[list[int]]:
    """The peak of Python's allocations while the block runs, in bytes (``tracemalloc``).
    Unlike the process's peak RSS, which an earlier test in the same worker process may
    already have raised past anything this one allocates, it can fail."""
    tracemalloc.start()
    peak = [0]
    try:
        yield peak
    finally:
        peak[0] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.mark.fault
@pytest.mark.parametrize("model", [ANTHROPIC, CHAT])
async def test_a_100_mb_argument_string_is_capped_and_never_held_whole(
    server: ReplayServer, model: str
) -> None:
    """P5: a 100 MiB argument string streamed in 256 KiB pieces. The adapter stops passing
    input on at the cap (1 MiB reaches the publisher, the rest is counted and dropped), the call
    is an error result, and the allocations made meanwhile peak far below the string: it was
    never joined or buffered whole. One piece object is sent 400 times, so the server's side of
    the test holds 256 KiB."""
    piece = "x" * 256 * 1024
    pieces = 400
    if model == ANTHROPIC:
        head = [tool_use(0, "call_big"), json_delta(0, '{"text": "')]
        body = json_delta(0, piece)
        tail = [json_delta(0, '"}'), a("content_block_stop", index=0), *END]
    else:
        opening = {"index": 0, "id": "call_big", "function": {"name": "echo", "arguments": ""}}
        head = [chat({"tool_calls": [opening]}), chat(_arguments('{"text": "'))]
        body = chat(_arguments(piece))
        tail = [chat(_arguments('"}')), chat({}, "tool_calls")]
    server.queue(Reply.events(*head, *[body] * pieces, *tail))
    with _peak_allocations() as peak:
        outcome = await run(settings(server), request(model))
    grown = peak[0]
    assert outcome.error is None
    streamed = sum(len(e.delta) for e in outcome.of(p.ToolInputDelta))
    assert streamed <= MAX_TOOL_INPUT_BYTES < pieces * len(piece)
    assert outcome.of(p.ToolCall)[0].input is None
    assert failed_inputs(outcome.events) == ["call_big"]
    assert grown < 40 * 1024 * 1024, f"allocations peaked at {grown / 2**20:.0f} MiB for 100 MiB"


@pytest.mark.parametrize("model", [RESPONSES, ANTHROPIC])
async def test_one_100_mb_event_is_cut_at_the_bound_and_never_held_whole(
    server: ReplayServer, model: str
) -> None:
    """P5 and D1: a 100 MiB string inside *one* server-sent event (a Responses
    ``output_item.done`` repeats a call's whole arguments; on Anthropic a text delta), sent in
    256 KiB pieces of one line. The SDKs' decoders would hold the event whole before any cap
    of ours saw it; the transport cuts the stream once the event passes ``MAX_EVENT_BYTES``:
    the turn ends with an ``invalid_output`` error naming the bound, after the events before
    it, and the allocations made meanwhile peak at a small multiple of the bound, far less than the
    event."""
    piece = b"x" * 256 * 1024
    if model == RESPONSES:
        warm = [a("response.completed", response={"status": "completed"})]
        before = [a("response.output_item.added", output_index=0, item=_call_item(""))]
        head = a("response.output_item.done", output_index=0, item=_call_item("<cut>"))
    else:
        warm = [*text_block(0, "warm"), a("content_block_stop", index=0), *END]
        before = text_block(0, "first")
        head = a("content_block_delta", index=0, delta={"type": "text_delta", "text": "<cut>"})
    server.queue(Reply.events(*warm))  # the SDK and the adapter load before the measure
    assert (await run(settings(server), request(model))).error is None
    opening, _, closing = head.partition(b"<cut>")
    server.queue(Reply.events(*before, opening, *[piece] * 400, closing))
    with _peak_allocations() as peak:
        outcome = await run(settings(server), request(model))
    grown = peak[0]
    assert outcome.error is not None and outcome.error.kind == "invalid_output"
    assert f"grew past {MAX_EVENT_BYTES} bytes" in outcome.error.message
    assert outcome.events, "what came before the enormous event was passed on"
    assert grown < 4 * MAX_EVENT_BYTES, f"allocations peaked at {grown / 2**20:.0f} MiB"


def _call_item(arguments: str) -> dict[str, object]:
    return {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_big",
        "name": "echo",
        "arguments": arguments,
    }


def _arguments(text: str) -> dict[str, object]:
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


async def test_unknown_events_and_fields_are_ignored_and_logged(
    server: ReplayServer, caplog: pytest.LogCaptureFixture
) -> None:
    """P6: forward compatible."""
    server.queue(
        Reply.events(
            a("message_start", message={"usage": {"input_tokens": 3}}, brand_new=True),
            a("content_block_start", index=0, content_block={"type": "hologram"}),
            a("content_block_stop", index=0),
            a("quantum_event", payload=[1, 2]),
            sse([1, 2, 3], event="content_block_delta"),
            *text_block(1, "ok"),
            a("content_block_stop", index=1),
            *END,
        )
    )
    with caplog.at_level(logging.WARNING, logger="activities.providers"):
        outcome = await run(settings(server), request(ANTHROPIC))
    assert outcome.error is None
    assert [type(e) for e in outcome.events] == [p.TextStart, p.TextDelta, p.TextEnd, p.StepFinish]
    logged = caplog.text
    assert "quantum_event" in logged and "hologram" in logged and "not a JSON object" in logged


async def test_fields_of_the_wrong_type_read_as_absent(server: ReplayServer) -> None:
    server.queue(
        Reply.events(
            sse({"choices": "nope", "usage": 7}),
            sse({"choices": [7, {"index": "x", "delta": {"content": 5, "tool_calls": "bad"}}]}),
            sse({"choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": 3}]}),
            chat({}, "stop"),
            sse({"choices": [], "usage": {"prompt_tokens": -4, "completion_tokens": 1e309}}),
        )
    )
    outcome = await run(settings(server), request(CHAT))
    assert outcome.error is None
    assert outcome.of(p.TextDelta) == [p.TextDelta(id="text-1", delta="fine")]
    assert outcome.finish == p.StepFinish(reason="stop", usage=p.Usage())


async def test_a_corrupt_event_is_invalid_output(server: ReplayServer) -> None:
    server.queue(Reply.events(chat({"content": "a"}), b'data: {"choices": [\n\n'))
    outcome = await run(settings(server), request(CHAT))
    assert outcome.error is not None and outcome.error.kind == "invalid_output"
    assert not outcome.error.retryable


async def test_a_reset_after_the_finish_keeps_the_finished_turn(server: ReplayServer) -> None:
    server.queue(Reply.events(chat({"content": "done"}), chat({}, "stop"), reset=True))
    outcome = await run(settings(server), request(CHAT))
    assert outcome.error is None
    assert outcome.finish.reason == "stop"


async def test_events_after_the_end_are_ignored(server: ReplayServer) -> None:
    server.queue(
        Reply.events(
            a("response.completed", response={"status": "completed"}),
            a("response.output_item.added", output_index=0, item={"type": "message", "id": "m"}),
        )
    )
    outcome = await run(settings(server), request(RESPONSES))
    assert outcome.events == [p.StepFinish(reason="stop")]
    assert json.dumps(outcome.finish.usage.model_dump()) == json.dumps(p.Usage().model_dump())
