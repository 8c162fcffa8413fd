"""Text no model request can carry (lone surrogates) never bricks a session."""

from __future__ import annotations

import pytest

from sessionflow.errors import UnencodableTextError
from sessionflow.models import events as ev
from sessionflow.models.common import Prompt
from tests.workflows.harness import Harness


async def test_a_prompt_with_a_lone_surrogate_is_refused_and_the_session_carries_on(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "fine"}])
    with pytest.raises(UnencodableTextError, match="The prompt text holds a lone surrogate"):
        await h.client.prompt(sid, "bad \ud800 prompt")
    assert (await h.client.status(sid)).pending_inputs == 0
    assert await h.types(sid) == ["session.created"]
    await h.client.prompt(sid, "good prompt")
    await h.client.wait_idle(sid, timeout=30)
    assert (await h.types(sid))[-1] == "session.execution.succeeded"
    assert h.requests()[0]["messages"][0]["content"][0]["text"] == "good prompt"


async def test_a_history_already_holding_a_lone_surrogate_still_reaches_the_model(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "one"}], [{"text": "two"}])
    # Admitted as an earlier version did, before admission refused such prompts.
    old = Prompt(text="old \ud800 prompt")
    await h.store.events.publish(
        ev.PromptAdmitted(session_id=sid, input_id="msg_old", prompt=old, delivery="steer")
    )
    await h.client.wake(sid, input_id="msg_old")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "next")
    await h.client.wait_idle(sid, timeout=30)
    assert (await h.types(sid)).count("session.execution.succeeded") == 2
    first, second = h.requests()
    assert first["messages"][0]["content"][0]["text"] == "old \ufffd prompt"
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]


async def test_a_system_prompt_holding_a_lone_surrogate_still_reaches_the_model(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "one"}], system="be \ud800 careful")
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    assert (await h.types(sid))[-1] == "session.execution.succeeded"
    assert h.requests()[0]["system"] == ["be \ufffd careful"]
