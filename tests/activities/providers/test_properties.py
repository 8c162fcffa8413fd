"""Property tests (reliability catalogue P9): mutate valid recorded streams — drop, duplicate,
reorder, truncate, corrupt — and check that only typed ``ProviderError``s come out, that every
event that does come out is accepted by the real publisher, and that the same bytes in give the
same events out.

Two levels: decoded events straight into each adapter's parser (many examples), and raw SSE bytes
through the local HTTP server and the official SDKs (fewer examples, each a real request).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activities.providers import base as p
from activities.providers.anthropic_stream import AnthropicParser
from activities.providers.errors import Label
from activities.providers.openai_chat_stream import ChatParser
from activities.providers.openai_responses_stream import ResponsesParser
from activities.providers.relay import Parser
from tests.activities.providers import support
from tests.activities.providers.server import ReplayServer, Reply

LABEL = Label("Test adapter", "test-model")
PARSERS: dict[str, Callable[[Label], Parser]] = {
    "chat": ChatParser,
    "responses": ResponsesParser,
    "anthropic": AnthropicParser,
}
RECORDINGS = {
    "chat": ["chat_text.sse", "chat_parallel_tools.sse", "chat_reasoning.sse"],
    "responses": ["responses_reasoning_tools.sse", "responses_web_search.sse"],
    "anthropic": ["anthropic_thinking_tools.sse", "anthropic_web_search.sse"],
}
MODELS = {
    "chat": "openai-chat/gpt-4o-mini",
    "responses": "openai/gpt-5",
    "anthropic": "anthropic/claude-haiku-4-5",
}
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(0, 2), max_size=2),
    st.dictionaries(
        st.sampled_from(["type", "id", "index", "text"]), st.integers(0, 2), max_size=2
    ),
)
PROPERTY = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HTTP_PROPERTY = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def decoded(name: str) -> list[dict[str, Any]]:
    events = []
    for chunk in support.recording(name):
        data = "".join(
            line[len("data: ") :]
            for line in chunk.decode().splitlines()
            if line.startswith("data: ")
        )
        if data != "[DONE]":
            events.append(json.loads(data))
    return events


def _slots(value: Any, found: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) in a decoded event, so a mutation can hit any field at any depth."""
    pairs = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in pairs:
        found.append((value, key))
        if isinstance(child, dict | list):
            _slots(child, found)
    return found


def _scalars(events: list[Any]) -> list[Any]:
    """Values already in the stream: reusing them forges id collisions and type swaps."""
    return [
        child
        for event in events
        for container, key in _slots(event, [])
        if isinstance(child := container[key], str | int)
    ]


@st.composite
def corrupted(draw: st.DrawFn, events: list[Any], index: int) -> Any:
    event = copy.deepcopy(events[index])
    slots = _slots(event, []) if isinstance(event, dict | list) else []
    if not slots:
        return draw(JUNK)
    container, key = draw(st.sampled_from(slots))
    action = draw(st.sampled_from(["junk", "reuse", "delete"]))
    pool = _scalars(events)
    if action == "delete" and isinstance(container, dict):
        del container[key]
    elif action == "reuse" and pool:
        container[key] = draw(st.sampled_from(pool))
    else:
        container[key] = draw(JUNK)
    return event


@st.composite
def mutated(draw: st.DrawFn, events: list[Any]) -> list[Any]:
    out = copy.deepcopy(events)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        i = draw(st.integers(0, len(out) - 1))
        operation = draw(st.sampled_from(["drop", "duplicate", "swap", "truncate", "corrupt"]))
        if operation == "drop":
            del out[i]
        elif operation == "duplicate":
            out.insert(draw(st.integers(0, len(out))), copy.deepcopy(out[i]))
        elif operation == "swap":
            j = draw(st.integers(0, len(out) - 1))
            out[i], out[j] = out[j], out[i]
        elif operation == "truncate":
            out = out[:i]
        else:
            out[i] = draw(corrupted(out, i))
    return out


def parse(adapter: str, events: list[Any]) -> tuple[list[Any], p.ProviderError | None]:
    parser = PARSERS[adapter](LABEL)
    out: list[Any] = []
    try:
        for event in events:
            if isinstance(event, dict):
                out += parser.feed(event)
        out += parser.end()
    except p.ProviderError as error:
        return out, error
    return out, None


def check(events: list[Any]) -> None:
    """The invariants: the publisher accepts every event; a finish comes last, at most once."""
    support.publish(events)
    finishes = [i for i, event in enumerate(events) if isinstance(event, p.StepFinish)]
    assert finishes in ([], [len(events) - 1])


def streams(adapter: str) -> st.SearchStrategy[list[Any]]:
    return st.sampled_from(RECORDINGS[adapter]).map(decoded).flatmap(mutated)


@PROPERTY
@given(st.data())
def test_chat_parser_survives_mutated_streams(data: st.DataObject) -> None:
    """Catalogue P9: fuzzed streams."""
    _parser_property("chat", data.draw(streams("chat")))


@PROPERTY
@given(st.data())
def test_responses_parser_survives_mutated_streams(data: st.DataObject) -> None:
    """Catalogue P9: fuzzed streams."""
    _parser_property("responses", data.draw(streams("responses")))


@PROPERTY
@given(st.data())
def test_anthropic_parser_survives_mutated_streams(data: st.DataObject) -> None:
    """Catalogue P9: fuzzed streams."""
    _parser_property("anthropic", data.draw(streams("anthropic")))


def _parser_property(adapter: str, events: list[Any]) -> None:
    first = parse(adapter, events)
    check(first[0])
    again = parse(adapter, events)
    assert again[0] == first[0]  # P7: the same input gives the same events
    assert (again[1] and again[1].message) == (first[1] and first[1].message)


def test_unmutated_recordings_parse_cleanly() -> None:
    for adapter, names in RECORDINGS.items():
        for name in names:
            events, error = parse(adapter, decoded(name))
            assert error is None, (name, error)
            check(events)


# --- bytes through the HTTP server and the SDKs ----------------------------------------------


@st.composite
def byte_streams(draw: st.DrawFn, adapter: str) -> list[bytes]:
    chunks = list(support.recording(draw(st.sampled_from(RECORDINGS[adapter]))))
    for _ in range(draw(st.integers(1, 3))):
        if not chunks:
            break
        i = draw(st.integers(0, len(chunks) - 1))
        operation = draw(st.sampled_from(["drop", "duplicate", "swap", "truncate", "flip"]))
        if operation == "drop":
            del chunks[i]
        elif operation == "duplicate":
            chunks.insert(i, chunks[i])
        elif operation == "swap":
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif operation == "truncate":
            cut = draw(st.integers(0, len(chunks[i])))
            chunks = [*chunks[:i], chunks[i][:cut]]
        elif chunks[i]:
            k = draw(st.integers(0, len(chunks[i]) - 1))
            chunks[i] = chunks[i][:k] + bytes([draw(st.integers(0, 255))]) + chunks[i][k + 1 :]
    return chunks


def _http_property(server: ReplayServer, adapter: str, chunks: list[bytes], reset: bool) -> None:
    server.reset()
    server.queue(Reply.events(*chunks, reset=reset))
    provider_settings = support.settings(server, web_search=True)
    outcome = asyncio.run(support.run(provider_settings, support.request(MODELS[adapter])))
    check(outcome.events)


@HTTP_PROPERTY
@given(data=st.data(), reset=st.booleans())
def test_chat_adapter_survives_mutated_bytes(
    replay_server: ReplayServer, data: st.DataObject, reset: bool
) -> None:
    """Catalogue P9: fuzzed streams."""
    _http_property(replay_server, "chat", data.draw(byte_streams("chat")), reset)


@HTTP_PROPERTY
@given(data=st.data(), reset=st.booleans())
def test_responses_adapter_survives_mutated_bytes(
    replay_server: ReplayServer, data: st.DataObject, reset: bool
) -> None:
    """Catalogue P9: fuzzed streams."""
    _http_property(replay_server, "responses", data.draw(byte_streams("responses")), reset)


@HTTP_PROPERTY
@given(data=st.data(), reset=st.booleans())
def test_anthropic_adapter_survives_mutated_bytes(
    replay_server: ReplayServer, data: st.DataObject, reset: bool
) -> None:
    """Catalogue P9: fuzzed streams."""
    _http_property(replay_server, "anthropic", data.draw(byte_streams("anthropic")), reset)
