"""What an operator's buttons in the Temporal UI (or the ``temporal`` CLI) do to a session.

Temporal knows the moment an operator terminates a drain that its run is over; the claim's
lease is there for when nobody knows. These tests hold a lease of ten minutes, far beyond every
wait here: a recovery that waited for the lease would fail them, never pass them slowly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.testing import WorkflowEnvironment

from activities.session import RESTART_TEXT
from activities.tools.base import Tool, ToolContext, ToolOutput
from sessionflow.errors import ClaimLostError
from store.claims import Claim
from store.events import StoredEvent
from tests.conftest import StoreFactory
from tests.workflows.harness import Harness, call, harness
from tests.workflows.operator_actions import reset_workflow
from tests.workflows.test_recovery import sweep
from tests.workflows.tools import Gate, registry
from worker import ensure_sweep_schedule

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
    return sid in (await sweep(h, env)).woken


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


# --- reset --------------------------------------------------------------------------------------


async def reset(h: Harness, sid: str, *, to: str) -> str:
    return await reset_workflow(h.client.temporal, h.client._handle(sid).id, to=to)


BASH_GATE = "echo ran >> {log}; while [ ! -f {gate} ]; do sleep 0.05; done; echo done"


async def _old_runs_writes_are_refused(h: Harness, sid: str, old_run: str) -> None:
    """A write as the old run (its zombie activity's) is refused by the claim's fence."""
    stored = [e async for e in h.store.events.log(sid) if isinstance(e, StoredEvent)]
    started = next(e for e in stored if e.data.type == "session.execution.started")
    assert started.execution_id is not None
    owner = f"{h.client._handle(sid).id}/{old_run}"
    zombie = Claim(sid, started.execution_id, owner, started.epoch or 1, 0, LEASE_MS)
    with pytest.raises(ClaimLostError, match=r"owned by|taken over"):
        await h.store.claims.renew(zombie)


@pytest.mark.parametrize("to", ["last", "first"])
async def test_a_reset_mid_tool_runs_the_command_once_and_fences_the_old_run(
    h: Harness, to: str
) -> None:
    """Issue 29: a reset run replays the old run's claim and attempt numbers. Its first write
    makes it the claim's owner; the old run's shell command, still running, is not run again
    (its call settles as outcome-unknown, or as interrupted when the reset goes back before the
    step), and the old run's writes are refused."""
    log, gate = h.workspace / "ran.txt", h.workspace / "bash.gate"
    held = h.gate_file("held")
    sid = await h.session(
        [call("b1", "bash", command=BASH_GATE.format(log=log, gate=gate), description="wait")],
        [{"wait_for_file": held}, {"text": "carried on"}],
        permissions=[{"tool": "bash", "action": "allow"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: log.exists())
    old_run = (await h.client._handle(sid).describe()).run_id
    assert old_run is not None
    await reset(h, sid, to=to)
    await h.until(lambda: _settled(h, sid, "b1"), timeout=60)
    await h.until(lambda: len(h.requests()) == 2, timeout=60)  # the next turn, still busy
    await _old_runs_writes_are_refused(h, sid, old_run)
    gate.touch()  # the old run's command would finish now, were it still running
    h.open_gate("held")
    await h.client.wait_idle(sid, timeout=60)
    assert log.read_text().count("ran") == 1
    (failed,) = [e for e in await h.events(sid) if e.type == "session.tool.failed"]
    assert failed.data["error"]["type"] in ("tool.outcome-unknown", "tool.stale")
    assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert assistants[-1].finish == "stop" and "carried on" in _text(assistants[-1])


async def _settled(h: Harness, sid: str, call_id: str) -> bool:
    settled = ("session.tool.success", "session.tool.failed")
    return any(e.type in settled and e.data["call_id"] == call_id for e in await h.events(sid))


async def test_a_reset_mid_stream_continues_the_turn_in_the_new_run_only(h: Harness) -> None:
    gate = h.gate_file("stream")
    turn = [
        {"text": "Before the reset.", "chunks": 2},
        {"wait_for_file": gate},
        {"text": " After."},
    ]
    sid = await h.session(turn, turn)  # the old run's request, then the new run's
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 1)
    old_run = (await h.client._handle(sid).describe()).run_id
    assert old_run is not None
    await reset(h, sid, to="last")
    await h.until(lambda: len(h.requests()) == 2)  # the new run's turn asks the model again
    await _old_runs_writes_are_refused(h, sid, old_run)
    h.open_gate("stream")
    await h.client.wait_idle(sid, timeout=60)
    types = await h.types(sid)
    # The new run carried the old run's claim or took it over, as where the reset went decides.
    assert types.count("session.execution.succeeded") == 1
    assert types[-1] == "session.execution.succeeded"
    assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert assistants[-1].finish == "stop"
    assert _text(assistants[-1]).count("After.") == 1


def _text(message: Any) -> str:
    return "".join(getattr(part, "text", "") for part in message.content if part.type == "text")


async def test_the_scheduled_sweep_notices_a_terminate_within_its_run(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """The Schedule starts a sweep run every 30 s that passes every few seconds: a drain
    terminated while that run is under way is recovered by one of its later passes, not by
    the next run."""
    schedule_id = await ensure_sweep_schedule(
        temporal_env.client,
        store=h.store,
        task_queue=h.client.task_queue,
        every=timedelta(seconds=30),
        passes_every=timedelta(milliseconds=500),
    )
    schedule = temporal_env.client.get_schedule_handle(schedule_id)
    try:
        await schedule.trigger()
        await h.until(lambda: _sweep_running(temporal_env, schedule_id), timeout=30)
        first = await _sweep_running(temporal_env, schedule_id)
        sid, dead = await _terminated_mid_tool(h)
        await h.until(lambda: len(h.requests()) == 2, timeout=30)
        await h.client.wait_idle(sid, timeout=60)
        await _after_takeover(h, sid, dead)
        # Still the run that was under way when the drain was terminated: one of its passes.
        assert await _sweep_running(temporal_env, schedule_id) == first
    finally:
        await schedule.delete()


async def _sweep_running(env: WorkflowEnvironment, schedule_id: str) -> str | None:
    """The workflow id of the Schedule's running sweep, if one runs."""
    description = await env.client.get_schedule_handle(schedule_id).describe()
    running = description.info.running_actions
    return running[0].workflow_id if running else None


async def test_a_reset_to_a_task_in_the_middle_of_a_busy_period_goes_on(h: Harness) -> None:
    """The old run had moved the step's attempt past the one the reset run replays: the new
    owner's attempts start again (``Claims.reown``), so its settlement is not refused."""
    held = h.gate_file("held")
    sid = await h.session(
        [call("c1", "echo", text="hi")],
        [{"text": "second step "}, {"wait_for_file": held}, {"text": "done"}],
        [{"text": "second step again "}, {"wait_for_file": held}, {"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    await _step_two_streams(h, sid)
    await reset(h, sid, to="middle")
    h.open_gate("held")
    await h.client.wait_idle(sid, timeout=60)
    types = await h.types(sid)
    assert "session.execution.failed" not in types and types[-1] == "session.execution.succeeded"
    assert [m.finish for m in await h.messages(sid) if m.type == "assistant"][-1] == "stop"


async def test_a_reset_that_runs_a_streaming_steps_start_again_ends_the_old_step(
    h: Harness,
) -> None:
    """The reset run runs again the workflow task that scheduled the turn now streaming, so it
    draws the step's message id again: its turn ends the old run's step, which that run's
    fenced stream can no longer end, with one ``step.failed`` before its own step starts (the
    harness's invariant check: one terminal per started step)."""
    held, again = h.gate_file("held"), h.gate_file("again")
    sid = await h.session(
        [call("c1", "echo", text="hi")],
        [{"text": "second step "}, {"wait_for_file": held}, {"text": "done"}],
        [{"text": "second step again "}, {"wait_for_file": again}, {"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    old = await _step_two_streams(h, sid)
    await reset(h, sid, to="streaming")
    await h.until(lambda: _steps_started(h, sid, 3), timeout=30)  # the reset run's step
    h.open_gate("held")  # the old run's stream goes on, fenced out
    h.open_gate("again")
    await h.client.wait_idle(sid, timeout=60)
    assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
    orphan = next(m for m in assistants if m.id == old)
    assert orphan.error is not None and "another run" in orphan.error.message
    assert _text(orphan) == "second step "  # what its stream made durable is kept
    assert assistants[-1].id != old and assistants[-1].finish == "stop"
    events = await h.events(sid)
    failed = [e.seq for e in events if e.type == "session.step.failed"]
    started = [e.seq for e in events if e.type == "session.step.started"]
    assert len(failed) == 1 and started[-1] > failed[0]  # ended before the new step began


async def _steps_started(h: Harness, sid: str, count: int) -> bool:
    return (await h.types(sid)).count("session.step.started") >= count


async def _step_two_streams(h: Harness, sid: str) -> str:
    """Wait until step 2's stream has made its start and its first text durable; its message
    id."""

    async def streaming() -> str | None:
        events = await h.events(sid)
        starts = [e for e in events if e.type == "session.step.started"]
        if len(starts) < 2:
            return None
        mid: str = starts[1].data["assistant_message_id"]
        text = [e for e in events if e.type == "session.text.delta"]
        return mid if any(e.data["assistant_message_id"] == mid for e in text) else None

    await h.until(streaming, timeout=30)
    found = await streaming()
    assert found is not None
    return found


class _AttemptDies(BaseException):
    """Not a tool failure: it escapes the tool and fails the activity's attempt."""


class _FlakyInput(BaseModel):
    gate: str


class Flaky(Tool[_FlakyInput]):
    """Retry-safe: its first attempt dies, its second waits on a gate, a third returns."""

    name = "flaky"
    description = "Dies once, then waits, then answers."
    input_model = _FlakyInput
    retry_safe = True

    def __init__(self) -> None:
        self.runs = 0

    async def execute(self, input: _FlakyInput, context: ToolContext) -> ToolOutput:
        self.runs += 1
        if self.runs == 1:
            raise _AttemptDies("the attempt dies")
        if self.runs == 2:
            while not Path(input.gate).exists():
                await asyncio.sleep(0.02)
        return ToolOutput.text(f"run {self.runs}", text=f"run {self.runs}")


async def test_a_reset_while_a_call_is_on_its_second_attempt_goes_on(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> None:
    """The old run's attempt 2 had taken the call; the reset run's attempt 1 is not refused
    as older (the new owner's attempts start again), and the busy period succeeds."""
    store = await open_test_store(lease_ms=LEASE_MS)
    flaky = Flaky()
    async with harness(
        temporal_env.client, store, tmp_path, tools=registry(Gate()).merged([("test", flaky)])
    ) as h:
        sid = await h.session([call("f1", "flaky", gate=h.gate_file("g"))], [{"text": "on"}])
        await h.client.prompt(sid, "Go")
        await h.until(lambda: flaky.runs == 2, timeout=30)
        await reset(h, sid, to="last")
        await h.client.wait_idle(sid, timeout=60)
        types = await h.types(sid)
        assert (
            "session.execution.failed" not in types and types[-1] == "session.execution.succeeded"
        )
        assert types.count("session.tool.success") == 1
