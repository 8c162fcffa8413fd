"""What an operator's buttons in the Temporal UI (or the ``temporal`` CLI) do to a session.

Temporal knows the moment an operator terminates a drain that its run is over; the claim's
lease is there for when nobody knows. These tests hold a lease of ten minutes, far beyond every
wait here: a recovery that waited for the lease would fail them, never pass them slowly.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.session import RESTART_TEXT
from sessionflow.models.drain import SweepInput, SweepResult
from store.events import StoredEvent
from tests.conftest import StoreFactory
from tests.workflows.harness import Harness, call, harness

LEASE_MS = 600_000


@pytest.fixture
async def h(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> AsyncIterator[Harness]:
    store = await open_test_store(lease_ms=LEASE_MS)
    async with harness(temporal_env.client, store, tmp_path) as running:
        yield running


async def _terminated_mid_tool(h: Harness) -> tuple[str, str]:
    """A session whose drain an operator terminated while its tool ran; (session, execution)."""
    sid = await h.session(
        [call("call_1", "gate", gate=h.gate_file("never"))],
        [{"text": "continued"}],
        [{"text": "and the new prompt answered"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    claim = await h.store.claims.current(sid)
    assert claim is not None
    await h.client._handle(sid).terminate("an operator pressed Terminate")
    return sid, claim.execution_id


async def _after_takeover(h: Harness, sid: str, dead: str) -> None:
    """The new busy period took the live claim over with a new epoch; every event after its
    start carries it; the dead execution's call settled once, as interrupted (not run again)."""
    stored = [e async for e in h.store.events.log(sid) if isinstance(e, StoredEvent)]
    started = [e for e in stored if e.data.type == "session.execution.started"]
    assert len(started) == 2 and started[0].execution_id == dead
    second = started[1]
    assert second.epoch == 2
    after = [e for e in stored if e.seq >= second.seq and e.execution_id is not None]
    assert {(e.execution_id, e.epoch) for e in after} == {(second.execution_id, 2)}
    first = next(m for m in await h.messages(sid) if m.type == "assistant")
    stale = first.tool("call_1").state.error
    assert (stale.type, stale.message) == ("tool.stale", "Tool execution interrupted: gate")
    assert [m.text for m in await h.messages(sid) if m.type == "synthetic"] == [RESTART_TEXT]
    assert len(h.gate.started) == 1  # the tool never ran again
    await h.until(lambda: h.gate.active == 0)  # the dead run's attempt stopped too
    assert await h.store.claims.current(sid) is None


async def test_a_prompt_after_terminate_takes_the_claim_over_at_once(h: Harness) -> None:
    sid, dead = await _terminated_mid_tool(h)
    await h.client.prompt(sid, "Go on")
    await h.client.wait_idle(sid, timeout=60)
    await _after_takeover(h, sid, dead)
    last = h.requests()[-1]
    users = [m["content"][0]["text"] for m in last["messages"] if m["role"] == "user"]
    assert users[0] == "Go" and users[-1] == "Go on"


async def _swept(h: Harness, env: WorkflowEnvironment, sid: str) -> bool:
    result = await env.client.execute_workflow(
        "RecoverySweep",
        SweepInput(),
        id=f"sweep-{uuid.uuid4()}",
        task_queue=h.client.task_queue,
        result_type=SweepResult,
    )
    return sid in result.woken


async def test_the_sweep_wakes_a_terminated_drain_while_its_claim_is_live(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    sid, dead = await _terminated_mid_tool(h)
    # Visibility may say the run is running a moment longer: the next sweep then sees it.
    await h.until(lambda: _swept(h, temporal_env, sid), timeout=30)
    await h.until(lambda: len(h.requests()) == 2, timeout=30)
    await h.client.wait_idle(sid, timeout=60)
    await _after_takeover(h, sid, dead)
    assert not await _swept(h, temporal_env, sid)  # idle now: nothing to wake


async def test_a_running_drain_is_never_taken_over_by_the_sweep(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    sid = await h.session([call("call_1", "gate", gate=h.gate_file("g"))], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    assert not await _swept(h, temporal_env, sid)
    h.open_gate("g")
    await h.client.wait_idle(sid, timeout=60)
    types = await h.types(sid)
    assert types.count("session.execution.started") == 1
    assert types.count("session.tool.success") == 1
