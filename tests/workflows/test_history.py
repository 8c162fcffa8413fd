"""Determinism and history hygiene: replay recorded histories, keep payloads small, bound runs."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from sessionflow.models.drain import SweepInput, SweepResult
from store import Store
from tests.conftest import start_dev_server
from tests.workflows.harness import Harness, call, harness
from tests.workflows.reordered import ReorderedRecoverySweep, ReorderedSessionWorkflow
from tests.workflows.tools import registry
from worker import build_worker
from workflows.session import SessionWorkflow
from workflows.sweep import RecoverySweep

HISTORIES = Path(__file__).parent / "histories"
SWEEP_HISTORIES = HISTORIES / "sweep"
MAX_PAYLOAD_BYTES = 4096


REPRESENTATIVE = (
    [
        {"reasoning": "think", "metadata": {"signature": "s"}},
        {"text": "Looking", "chunks": 4},
        call("c1", text="a"),
        call("c2", text="b"),
        call("c3", "fail"),
    ],
    [{"error": {"kind": "transport", "message": "Disconnected"}}],
    [{"text": "Done", "chunks": 2}],
)


async def run_representative(h: Harness) -> WorkflowHistory:
    sid = await h.session(*REPRESENTATIVE)
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=60)
    return await h.client._handle(sid).fetch_history()


def replayer(*workflows: type) -> Replayer:
    return Replayer(workflows=list(workflows), data_converter=pydantic_data_converter)


async def test_a_fresh_history_replays_and_its_payloads_stay_small(h: Harness) -> None:
    """Catalogue C10: replay and nondeterminism."""
    history = await run_representative(h)
    await replayer(SessionWorkflow).replay_workflow(history)
    sizes = list(_payload_sizes(MessageToDict(history.events[0])))
    for event in history.events[1:]:
        sizes += _payload_sizes(MessageToDict(event))
    assert sizes and max(sizes) < MAX_PAYLOAD_BYTES, max(sizes)
    if os.environ.get("SESSIONFLOW_RECORD_HISTORIES"):
        (HISTORIES / "representative.json").write_text(json.dumps(history.to_json_dict()))


async def test_a_history_with_a_person_answering_replays(h: Harness) -> None:
    """Catalogue C10: a call that waits for approval (a durable wait in the workflow, then an
    update answering it) replays; recorded as ``approval.json`` with the representative one."""
    from tests.workflows.test_permissions import asked

    sid = await h.session([call("b1", "bash", command="touch a")], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    await h.client.respond(sid, request.request_id, "once")
    await h.client.wait_idle(sid, timeout=60)
    history = await h.client._handle(sid).fetch_history()
    await replayer(SessionWorkflow).replay_workflow(history)
    assert (h.workspace / "a").exists()
    if os.environ.get("SESSIONFLOW_RECORD_HISTORIES"):
        (HISTORIES / "approval.json").write_text(json.dumps(history.to_json_dict()))


async def _replayed_and_recorded(h: Harness, sid: str, name: str, *, run_id: str = "") -> None:
    """The session's run (its first with ``run_id``) replays; recorded as ``<name>.json``."""
    history = await h.client.temporal.get_workflow_handle(
        h.client._handle(sid).id, run_id=run_id or None
    ).fetch_history()
    await replayer(SessionWorkflow).replay_workflow(history)
    if os.environ.get("SESSIONFLOW_RECORD_HISTORIES"):
        (HISTORIES / f"{name}.json").write_text(json.dumps(history.to_json_dict()))


async def test_a_history_with_an_interrupt_replays(h: Harness) -> None:
    """Catalogue C10: an interrupt mid-tool (the turn and tool cancelled and settled)."""
    sid = await h.session([call("g1", "gate", gate=h.gate_file("never"))], [{"text": "x"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    assert await h.client.interrupt(sid)
    await h.client.wait_idle(sid, timeout=60)
    await _replayed_and_recorded(h, sid, "interrupt")


async def test_a_history_with_a_revert_and_an_unrevert_replays(h: Harness) -> None:
    """Catalogue C10: the revert's busy period (its activity on the workspace's queue), an
    unrevert, and a dry run answered from the update handler."""
    sid = await h.session([call("w1", "write", path="a.txt", content="a")], [{"text": "x"}])
    receipt = await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=60)
    assert (await h.client.revert(sid, receipt.id, dry_run=True)).paths
    assert (await h.client.revert(sid, receipt.id)).applied
    assert (await h.client.unrevert(sid)).applied
    await h.client.wait_idle(sid, timeout=60)
    await _replayed_and_recorded(h, sid, "revert")


async def test_a_history_with_a_compaction_replays(h: Harness) -> None:
    """Catalogue C10: a manual compaction between two prompts."""
    sid = await h.session([{"text": "first"}], [{"text": "the summary"}], [{"text": "second"}])
    await h.client.prompt(sid, "one")
    await h.client.wait_idle(sid, timeout=60)
    await h.client.compact(sid)
    await h.client.prompt(sid, "two")
    await h.until(lambda: len(h.requests()) == 3, timeout=60)
    await h.client.wait_idle(sid, timeout=60)
    await _replayed_and_recorded(h, sid, "compaction")


async def test_a_history_with_a_recovery_replays(h: Harness) -> None:
    """Catalogue C10: a drain terminated mid-tool, its claim taken over by the next prompt's
    run, which recovers the step (the stale call, the restart message)."""
    sid = await h.session(
        [call("g1", "gate", gate=h.gate_file("never"))], [{"text": "recovered"}], [{"text": "x"}]
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    await h.client._handle(sid).terminate("recorded: the drain is lost")
    await h.client.prompt(sid, "Go on")
    await h.client.wait_idle(sid, timeout=60)
    await _replayed_and_recorded(h, sid, "recovery")


async def test_a_history_of_a_reset_run_replays(h: Harness) -> None:
    """Catalogue C10 (issue 29): the run an operator's Reset made, mid-tool, which carries
    the old run's claim on (``own``) and settles the re-issued call as outcome-unknown."""
    from tests.workflows.operator_actions import reset_workflow

    sid = await h.session(
        [call("g1", "gate", gate=h.gate_file("g"))], [{"text": "after the reset"}], [{"text": "x"}]
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    new_run = await reset_workflow(h.client.temporal, h.client._handle(sid).id, to="last")
    h.open_gate("g")
    await h.client.wait_idle(sid, timeout=60)
    await _replayed_and_recorded(h, sid, "reset", run_id=new_run)


async def test_a_history_with_a_lost_turn_restarted_replays(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """Catalogue C10: a turn past its bound is lost, not failed, and the step restarted."""
    slow = {"text": "slow " * 40, "chunks": 40, "delay_ms": 60}  # past the 1 s bound
    async with harness(temporal_env.client, store, tmp_path, turn_timeout_s=1) as h:
        sid = await h.session([slow], [{"text": "continued"}])
        await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid, timeout=60)
        assert [m.type for m in await h.messages(sid)].count("synthetic") == 1
        await _replayed_and_recorded(h, sid, "lost-turn")


async def test_a_history_of_the_recovery_sweep_replays(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """Catalogue C10: the recovery sweep's own workflow, two rounds (a timer between them),
    waking a session whose drain was terminated mid-tool and whose claim expired."""
    from tests.store.helpers import expire_claim

    sid = await h.session([call("g1", "gate", gate=h.gate_file("never"))], [{"text": "x"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    await h.client._handle(sid).terminate("recorded: the drain is lost")
    await h.until(lambda: h.gate.active == 0)
    await expire_claim(h.store, sid)
    handle = await temporal_env.client.start_workflow(
        "RecoverySweep",
        SweepInput(rounds=2, every_s=0.1),
        id=f"sweep-{uuid.uuid4()}",
        task_queue=h.client.task_queue,
        result_type=SweepResult,
    )
    assert sid in (await handle.result()).woken
    await h.client.wait_idle(sid, timeout=60)
    history = await handle.fetch_history()
    await replayer(RecoverySweep).replay_workflow(history)
    if os.environ.get("SESSIONFLOW_RECORD_HISTORIES"):
        (SWEEP_HISTORIES / "sweep.json").write_text(json.dumps(history.to_json_dict()))


def stored_sweep_histories() -> list[Path]:
    return sorted(SWEEP_HISTORIES.glob("*.json"))


@pytest.mark.parametrize("path", stored_sweep_histories(), ids=lambda p: p.stem)
async def test_recorded_sweep_histories_replay_and_a_reordered_sweep_fails(path: Path) -> None:
    """Catalogue C10: the recovery sweep's recorded histories replay with the current
    workflow, and fail with a reordered one (the negative control)."""
    history = WorkflowHistory.from_json("sweep-recorded", json.loads(path.read_text()))
    await replayer(RecoverySweep).replay_workflow(history)
    result = await replayer(ReorderedRecoverySweep).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


def _payload_sizes(node: Any) -> list[int]:
    """Sizes of every payload's data (base64 in the JSON form) anywhere in an event."""
    if isinstance(node, dict):
        if "data" in node and "metadata" in node and isinstance(node["data"], str):
            return [len(node["data"]) * 3 // 4]
        return [size for value in node.values() for size in _payload_sizes(value)]
    if isinstance(node, list):
        return [size for value in node for size in _payload_sizes(value)]
    return []


def stored_histories() -> list[Path]:
    return sorted(HISTORIES.glob("*.json"))


@pytest.mark.parametrize("path", stored_histories(), ids=lambda p: p.stem)
async def test_recorded_histories_replay_with_the_current_workflow(path: Path) -> None:
    """Catalogue C10: replay and nondeterminism."""
    history = WorkflowHistory.from_json("session-recorded", json.loads(path.read_text()))
    await replayer(SessionWorkflow).replay_workflow(history)


@pytest.mark.parametrize("path", stored_histories(), ids=lambda p: p.stem)
async def test_a_reordered_workflow_fails_replay(path: Path) -> None:
    """Catalogue C10: replay and nondeterminism."""
    history = WorkflowHistory.from_json("session-recorded", json.loads(path.read_text()))
    result = await replayer(ReorderedSessionWorkflow).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert result.replay_failure is not None
    assert "nondetermin" in str(result.replay_failure).lower()


def test_histories_are_recorded() -> None:
    """Catalogue C10: replay and nondeterminism."""
    assert stored_histories(), "record with SESSIONFLOW_RECORD_HISTORIES=1"
    assert stored_sweep_histories(), "record with SESSIONFLOW_RECORD_HISTORIES=1"


# --- continue-as-new ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def small_history_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server("limit.historyCount.suggestContinueAsNew=40")
    yield env
    await env.shutdown()


async def test_continue_as_new_keeps_queued_inputs_and_wakes(
    small_history_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """Catalogue D5: a very long session."""
    async with harness(small_history_env.client, store, tmp_path) as h:
        sid = await h.session(*[[{"text": f"answer {i}"}] for i in range(5)])
        handle = h.client._handle(sid)
        await h.client.prompt(sid, "first")
        await h.client.wait_idle(sid, timeout=30)
        first_run = (await handle.describe()).run_id
        for i in range(2, 6):
            await h.client.prompt(sid, f"prompt {i}", delivery="queue")
        await h.until(lambda: len(h.requests()) == 5, timeout=60)
        await h.client.wait_idle(sid, timeout=30)
        assert (await handle.describe()).run_id != first_run
        users = [
            m["content"][0]["text"] for m in h.requests()[-1]["messages"] if m["role"] == "user"
        ]
        assert users == ["first", "prompt 2", "prompt 3", "prompt 4", "prompt 5"]
        types = await h.types(sid)
        assert types.count("session.execution.started") == types.count(
            "session.execution.succeeded"
        )


async def test_continue_as_new_mid_busy_period_carries_the_claim_and_step(
    small_history_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """Catalogue D5: a very long session."""
    async with harness(small_history_env.client, store, tmp_path) as h:
        turns = [[call(f"c{i}", text=str(i))] for i in range(6)] + [[{"text": "all done"}]]
        sid = await h.session(*turns)
        handle = h.client._handle(sid)
        await h.client.prompt(sid, "many steps")
        await h.until(lambda: len(h.requests()) == 7, timeout=60)
        await h.client.wait_idle(sid, timeout=30)
        runs = [e async for e in h.client.temporal.list_workflows(f"WorkflowId = '{handle.id}'")]
        assert len(runs) >= 2  # the busy period continued as new at least once
        events = await h.events(sid)
        started = [e for e in events if e.type == "session.execution.started"]
        ended = [e for e in events if e.type == "session.execution.succeeded"]
        assert len(started) == len(ended) == 1
        assert started[0].data["execution_id"] == ended[0].data["execution_id"]
        stored = (await store.events.read_after(sid, limit=10_000)).events
        stamps = {(e.execution_id, e.epoch) for e in stored if e.execution_id is not None}
        assert stamps == {(started[0].data["execution_id"], 1)}  # one claim across the runs
        assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
        assert [a.finish for a in assistants] == ["tool-calls"] * 6 + ["stop"]
        assert all(
            a.tool(f"c{i}").state.status == "completed" for i, a in enumerate(assistants[:6])
        )


async def test_continue_as_new_mid_busy_period_keeps_the_sessions_host(
    small_history_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """Issue 28: the placement survives continue-as-new: every step's tool runs on the host."""
    async with harness(small_history_env.client, store, tmp_path) as h:
        on_b = build_worker(
            h.client.temporal,
            store,
            task_queue=h.client.task_queue,
            tools=registry(h.gate),
            host="b",
            serve="tools",
        )
        async with on_b:
            turns = [[call(f"c{i}", text=str(i))] for i in range(6)] + [[{"text": "all done"}]]
            sid = await h.session(*turns, host="b")
            handle = h.client._handle(sid)
            await h.client.prompt(sid, "many steps")
            await h.client.wait_idle(sid, timeout=60)
        runs = [e async for e in h.client.temporal.list_workflows(f"WorkflowId = '{handle.id}'")]
        assert len(runs) >= 2  # the busy period continued as new at least once
        settled = [e for e in await h.events(sid) if e.type == "session.tool.success"]
        assert [e.data["call_id"] for e in settled] == [f"c{i}" for i in range(6)]
        assert {e.data["host"] for e in settled} == {"b"}


async def test_a_history_that_continues_as_new_mid_busy_period_replays(
    small_history_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """Catalogue C10: the first run of a busy period that continued as new."""
    async with harness(small_history_env.client, store, tmp_path) as h:
        turns = [[call(f"c{i}", text=str(i))] for i in range(6)] + [[{"text": "all done"}]]
        sid = await h.session(*turns)
        await h.client.prompt(sid, "many steps")
        await h.client.wait_idle(sid, timeout=60)
        first = (await h.client._handle(sid).describe()).raw_description
        run_id = first.workflow_execution_info.first_run_id
        assert run_id and run_id != first.workflow_execution_info.execution.run_id
        await _replayed_and_recorded(h, sid, "continue-as-new", run_id=run_id)


async def test_a_resume_sent_while_an_interrupt_settles_runs_even_when_history_is_long(
    small_history_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with harness(small_history_env.client, store, tmp_path) as h:
        sid = await h.session(
            [call("g1", "gate", gate=h.gate_file("never"))], [{"text": "resumed"}]
        )
        await h.client.prompt(sid, "Go")
        await h.until(lambda: h.gate.active == 1)
        assert await h.client.interrupt(sid)
        outcome = await asyncio.wait_for(h.client.resume(sid), 30)
        assert outcome.type == "succeeded"
        assert len(h.requests()) == 2
