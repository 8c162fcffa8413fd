"""What every adapter sends: a request body that can be encoded, whatever the history holds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from activities.providers import base as p
from tests.activities.providers import support
from tests.activities.providers.server import ReplayServer, Reply

REPLIES = {
    "openai-chat/gpt-4o-mini": "chat_text.sse",
    "openai/gpt-5": "responses_web_search.sse",
    "anthropic/claude-haiku-4-5": "anthropic_web_search.sse",
}


def history() -> tuple[p.RequestMessage, ...]:
    """A turn whose stored text holds lone surrogates everywhere a model's request carries text."""
    call = p.ToolCallPartIn(call_id="call_1", name="echo", input={"text": "bad \udcff name"})
    result = p.ToolResultPartIn(call_id="call_1", name="echo", output="out \udcff put")
    return (
        support.user("half \ud83d an emoji"),
        p.RequestMessage(role="assistant", content=(p.TextPartIn(text="split \ud83d\ude00"), call)),
        p.RequestMessage(role="tool", content=(result,)),
        support.user("Again."),
    )


@pytest.mark.parametrize("model", list(REPLIES))
async def test_lone_surrogates_reach_the_model_as_replacement_characters(
    server: ReplayServer, model: str
) -> None:
    server.queue(Reply.events(*support.recording(REPLIES[model])))
    request = support.request(model, *history(), system=("system \ud800 prompt",))
    outcome = await support.run(support.settings(server), request)
    assert outcome.error is None
    sent = "\n".join(strings(server.last().json()))
    assert re.search("[\ud800-\udfff]", sent) is None
    for text in ("system", "half", "split \ufffd\ufffd", "bad", "out \ufffd put"):
        assert text in sent
    assert all(f"{word} \ufffd" in sent for word in ("system", "half", "bad"))


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON body (tool arguments are JSON text themselves: a string too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
