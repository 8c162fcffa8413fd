"""Budgets that pause, never fail (issue 30 §2), on a real Temporal dev server, both databases.

The scripted model's price makes each step's cost exact: 1000 USD per million input tokens, so
a step that reports 1000 input tokens costs 1 USD.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.errors import InvalidInputError
from store import Store
from tests.workflows.harness import Harness, call, harness

PRICE = {"input": 1000.0, "output": 1000.0}


def step(*events: dict[str, Any], reason: str = "stop", tokens: int = 1000) -> list[dict[str, Any]]:
    return [*events, {"finish": {"reason": reason, "usage": {"input": tokens}}}]


@pytest.fixture
async def idle(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> AsyncIterator[Harness]:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        yield h


async def terminal(h: Harness, sid: str) -> list[tuple[str, Any]]:
    ends = ("session.execution.succeeded", "session.execution.interrupted")
    return [(e.type, e.data.get("reason")) for e in await h.events(sid) if e.type in ends]


async def test_a_budget_stops_at_the_step_boundary_and_resume_continues_there(
    idle: Harness,
) -> None:
    h = idle
    sid = await h.session(
        step(call("c1", text="once"), reason="tool-calls"),  # 1 USD: past the budget
        step({"text": "after the tool"}),
        step({"text": "the queued prompt"}),
        price=PRICE,
        budget={"usd": 0.5},
    )
    async with h.worker():
        await h.client.prompt(sid, "Work")
        await h.client.wait_idle(sid, timeout=30)
        # The step that crossed the limit finished (its tool too); the next never asked.
        assert len(h.requests()) == 1
        assert await terminal(h, sid) == [("session.execution.interrupted", "budget")]
        status = await h.client.status(sid)
        assert status.budget_reached is not None and status.budget_reached.limit == "usd"
        assert status.budget_reached.spent == pytest.approx(1.0)
        assert "budget reached: $1.0000 spent of $0.5" in status.budget_reached.describe()
        # A prompt while over budget waits: admitted, never promoted, no request.
        await h.client.prompt(sid, "Then this", delivery="queue")
        await h.client.wait_idle(sid, timeout=30)
        assert len(h.requests()) == 1
        assert (await h.client.status(sid)).pending_inputs == 1
    # The budget is the store's: a new worker (a restart) stops the session the same way.
    async with h.worker():
        outcome = await h.client.resume(sid)
        assert (outcome.type, outcome.reason) == ("interrupted", "budget")
        assert len(h.requests()) == 1
        await h.client.set_budget(sid, {"usd": 10.0})
        outcome = await h.client.resume(sid)
        assert outcome.type == "succeeded"
        await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 3
    # The next request continued from the tool's result; the queued prompt came after.
    assert h.roles(requests[1])[-1] == "tool"
    assert h.roles(requests[2])[-1] == "user"
    types = await h.types(sid)
    assert types.count("session.tool.called") == 1
    assert types.count("session.step.started") == 3
    info = await h.client.session(sid)
    assert info.spend.cost == pytest.approx(3.0)
    assert info.budget is not None and info.budget.usd == 10.0
    assert (await h.client.status(sid)).pending_inputs == 0


async def test_a_token_budget_counts_every_token_and_clearing_it_lifts_the_stop(
    h: Harness,
) -> None:
    sid = await h.session(
        step(call("c1", text="x"), reason="tool-calls", tokens=300),
        step({"text": "done"}, tokens=300),
        budget={"tokens": 300},
    )
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    status = await h.client.status(sid)
    assert status.budget_reached is not None and status.budget_reached.limit == "tokens"
    assert len(h.requests()) == 1
    # No price: the spend is tokens, its cost unknown, never $0.
    assert status.spend.cost is None and status.spend.unpriced_steps == 1
    await h.client.set_budget(sid, None)
    assert (await h.client.session(sid)).budget is None
    assert (await h.client.resume(sid)).type == "succeeded"
    assert len(h.requests()) == 2


@pytest.mark.parametrize(
    "bad", [{"usd": 0}, {"usd": -2}, {"tokens": 1.5}, {"dollars": 3}, {"usd": "lots"}]
)
async def test_a_bad_budget_is_refused_naming_it(h: Harness, bad: dict[str, Any]) -> None:
    sid = await h.session(step({"text": "hi"}))
    with pytest.raises(InvalidInputError) as raised:
        await h.client.set_budget(sid, bad)
    assert raised.value.field == "budget" and "Invalid budget" in str(raised.value)
    with pytest.raises(InvalidInputError):
        await h.session(step({"text": "hi"}), budget=bad)
    assert (await h.client.session(sid)).budget is None
