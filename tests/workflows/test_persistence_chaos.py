"""Catalogue C6 through drains: the store's every statement is counted, and every few meet a
fault (``tests.faults``): serialization failures and deadlocks (PostgreSQL), the write lock
held (SQLite's busy), lost connections and timeouts, commits whose answer is lost. The drains
end as an unharmed run does, and the harness runs the invariant checker over every session."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from sessionflow.models import events as ev
from tests.conftest import Target
from tests.faults import Fault, injecting
from tests.invariants import final_log
from tests.workflows.harness import Harness, call, harness

SESSIONS = 3


def cycle(backend: str, *, transient_only: bool) -> tuple[Fault, ...]:
    if backend == "sqlite":
        return ("busy",) if transient_only else ("busy", "commit_then_fail")
    if transient_only:
        return ("serialization", "deadlock")
    return ("serialization", "deadlock", "commit_then_fail")


def collapsed(types: list[str]) -> list[str]:
    """Consecutive token deltas as one (their batching depends on timing, not on faults)."""
    out: list[str] = []
    for t in types:
        if not (t.endswith(".delta") and out and out[-1] == t):
            out.append(t)
    return out


@pytest.mark.fault
async def test_drains_under_counted_persistence_faults_end_as_unharmed_ones(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C6 (and C2, the lost commit answers): sessions with a plain turn and a tool turn,
    drained while every 5th write statement meets a transient fault (40001, 40P01 and a commit
    whose answer is lost on PostgreSQL; the write lock held and a lost commit answer on
    SQLite), on the fenced path's pooled connections and the hot path's alike. Every busy
    period succeeds, the tool runs and settles once, the answers are the model's, no turn is
    restarted (a conflict inside a fenced write is run again by ``run_fenced``); the checker
    passes (harness)."""
    backend = h.store.db.dialect
    with injecting(monkeypatch) as faults:
        sids = []
        for i in range(SESSIONS):
            sids.append(
                await h.session(
                    # Paced chunks: the deltas after the first flush go in batches of
                    # deltas alone, the hot path.
                    [{"text": f"plain {i} more end", "chunks": 8, "delay_ms": 40}],
                    [call(f"call_{i}", text="hi")],
                    [{"text": "done", "chunks": 2}],
                )
            )
        faults.chaos(5, cycle(backend, transient_only=False))
        for sid in sids:
            await h.client.prompt(sid, "first")
            await h.client.wait_idle(sid, timeout=60)
            await h.client.prompt(sid, "second")
            await h.client.wait_idle(sid, timeout=60)
        faults.chaos(0, ())
    assert set(faults.seen) == set(cycle(backend, transient_only=False)), faults.seen
    if backend == "postgresql":  # SQLite's busy strikes at BEGIN, on whichever connection
        assert faults.pooled_struck > 0, "no fault met the fenced path"
    for sid in sids:
        types = collapsed(await h.types(sid))
        assert types.count("session.execution.succeeded") == 2
        assert types.count("session.tool.success") == 1
        assert types.count("session.tool.error") == 0
        assert "session.synthetic" not in types, "a turn was restarted"
        assert "session.step.failed" not in types
        texts = [e.data.get("text") for e in await h.events(sid) if e.type == "session.text.ended"]
        # The script's turns are served in order across sessions.
        assert texts[-1] == "done" and texts[0].endswith(" more end"), texts


async def test_activities_whose_commit_answer_is_lost_are_retried_and_write_once(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C2 through a drain (PostgreSQL, where the injector sees which event a statement
    writes): the tool's settlement (one statement on the hot path), the step's settlement
    (``finish_step``, a fenced transaction) and the busy period's terminal with its release
    (``finish_execution``) each commit and then lose their answer. Each is retried (the tool's
    by ``through_outages``, the others by Temporal) and finds its own write: one settlement,
    one step end per step, one terminal, no turn restarted; the checker passes (harness)."""
    store = await postgres_target.open()
    armed = [
        ev.ToolSucceeded.stored_type(),
        ev.StepEnded.stored_type(),
        ev.ExecutionSucceeded.stored_type(),
    ]
    try:
        with injecting(monkeypatch) as faults:
            async with harness(temporal_env.client, store, tmp_path) as h:
                sid = await h.session([call("call_1", text="hi")], [{"text": "done"}])
                faults.commit_on += armed
                await h.client.prompt(sid, "Go")
                await h.client.wait_idle(sid, timeout=60)
                log = await final_log(store, sid)
                handle = temporal_env.client.get_workflow_handle(f"session-{sid}")
                await handle.result()  # the drain itself ended well, not only its log
                status = (await handle.describe()).status
    finally:
        await store.close()
    assert faults.seen == {f"commit_then_fail:{t}": 1 for t in armed}
    assert status == WorkflowExecutionStatus.COMPLETED
    types = [e.data.type for e in log]
    assert types.count("session.tool.success") == 1
    assert types.count("session.step.ended") == 2
    assert types.count("session.execution.succeeded") == 1
    assert "session.synthetic" not in types and "session.step.failed" not in types


async def test_a_turn_whose_own_settlement_loses_its_answer_leaves_it_to_the_workflow(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step without tools ends with its turn (``stream_turn`` settles it, no
    ``finish_step``). When that settlement commits and loses its answer (C2), the turn hands
    the step to the workflow instead of failing: ``finish_step`` finds the step already ended
    and writes nothing, and the model is not asked again."""
    store = await postgres_target.open()
    try:
        with injecting(monkeypatch) as faults:
            async with harness(temporal_env.client, store, tmp_path) as h:
                sid = await h.session([{"text": "done"}])
                faults.commit_on.append(ev.StepEnded.stored_type())
                await h.client.prompt(sid, "Go")
                await h.client.wait_idle(sid, timeout=60)
                log = await final_log(store, sid)
                handle = temporal_env.client.get_workflow_handle(f"session-{sid}")
                await handle.result()
                history = await handle.fetch_history()
    finally:
        await store.close()
    assert faults.seen == {f"commit_then_fail:{ev.StepEnded.stored_type()}": 1}
    types = [e.data.type for e in log]
    assert types.count("session.step.ended") == 1
    assert types.count("session.step.started") == 1  # one request: the turn was not restarted
    assert types.count("session.execution.succeeded") == 1
    recorded = b"".join(e.SerializeToString() for e in history.events)
    assert b"finish_step" in recorded  # the workflow settled it after all


async def test_conflicts_on_the_fenced_path_are_retried_inside_their_activity(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C6 on the drain's fenced writes, PostgreSQL: a 40001 and then a 40P01 strike the write
    of each -- the claim with its ``execution.started`` (``claim_and_prepare``), the turn's
    opening (``_begin``: its request count), a step's settlement (``finish_step``: its
    ``step.ended``) and the terminal with its release (``finish_execution``). The claim, the
    step's end and the terminal are one statement each on the hot path, the opening (which
    promotes the prompt) a pooled transaction; the store runs each again inside the same
    activity attempt (every fault struck on attempt 1), so no turn is restarted, no step
    fails, the tool runs once and the drain completes; the checker passes (harness). The
    pooled path's own retries are tested at the store's level (``test_persistence_faults``)."""
    store = await postgres_target.open()
    aimed = {  # what the write carries: the activity it belongs to
        ev.ExecutionStarted.stored_type(): "claim_and_prepare",
        "SET request_count": "stream_turn",
        ev.StepEnded.stored_type(): "finish_step",
        ev.ExecutionSucceeded.stored_type(): "finish_execution",
    }
    transient: list[Fault] = ["serialization", "deadlock"]
    try:
        with injecting(monkeypatch) as faults:
            async with harness(temporal_env.client, store, tmp_path) as h:
                sid = await h.session([call("call_1", text="hi")], [{"text": "done"}])
                for marker in aimed:
                    faults.strike(marker, transient)
                await h.client.prompt(sid, "Go")
                await h.client.wait_idle(sid, timeout=60)
                log = await final_log(store, sid)
                handle = temporal_env.client.get_workflow_handle(f"session-{sid}")
                await handle.result()
                status = (await handle.describe()).status
                history = await handle.fetch_history()
    finally:
        await store.close()
    assert not faults.strikes, f"never met: {faults.strikes}"
    assert [(m, f) for m, f, _ in faults.struck] == [(m, f) for m in aimed for f in transient]
    for marker, name in aimed.items():
        # Both faults met by one activity's first attempt: the store ran the work again, not
        # Temporal the activity, nor the workflow another activity in its place.
        ((kind, _id, attempt),) = {where for m, _, where in faults.struck if m == marker}
        assert (kind, attempt) == (name, 1), (marker, faults.struck)
    failed = [e for e in history.events if e.HasField("activity_task_failed_event_attributes")]
    assert not failed, failed
    assert status == WorkflowExecutionStatus.COMPLETED
    types = [e.data.type for e in log]
    assert "session.synthetic" not in types, "a turn was restarted"
    assert "session.step.failed" not in types
    assert types.count("session.tool.success") == 1
    assert types.count("session.step.ended") == 2
    assert types.count("session.execution.succeeded") == 1


async def test_a_claim_and_a_turn_opening_whose_commit_answer_is_lost_write_once(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """C2 at a busy period's first fenced writes (PostgreSQL): the claim with its
    ``execution.started`` (``claim_and_prepare``), the turn's opening, which promotes the
    prompt (``prompt.promoted``), and the turn's first batch (its ``step.started``) each commit
    and then lose their answer. Each is found written when asked again: one
    ``execution.started``, one promotion, one step started and none failed, one request to the
    model, the busy period succeeds; the checker passes (harness)."""
    store = await postgres_target.open()
    armed = [
        ev.ExecutionStarted.stored_type(),
        ev.PromptPromoted.stored_type(),
        ev.StepStarted.stored_type(),
    ]
    try:
        with injecting(monkeypatch) as faults:
            async with harness(temporal_env.client, store, tmp_path) as h:
                sid = await h.session([{"text": "done"}], [{"text": "again"}])
                faults.commit_on += armed
                await h.client.prompt(sid, "Go")
                await h.client.wait_idle(sid, timeout=60)
                log = await final_log(store, sid)
                requests = h.requests()
    finally:
        await store.close()
    assert faults.seen == {f"commit_then_fail:{t}": 1 for t in armed}
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1
    assert types.count("session.prompt.promoted") == 1
    assert types.count("session.step.started") == 1 and "session.step.failed" not in types
    assert types[-1] == "session.execution.succeeded"
    assert len(requests) == 1  # the model was asked once: the lost opening asked nothing
