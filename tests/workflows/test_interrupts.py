"""Interrupts mean interrupts: in a continued run's first activation, while the claim is being
acquired, and when no worker is there to answer."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import psycopg
from temporalio.api.enums.v1 import EventType
from temporalio.client import WithStartWorkflowOperation, WorkflowUpdateStage
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from activities.session import SessionActivities
from sessionflow.client import SESSION_ID_ATTRIBUTE
from sessionflow.models.drain import (
    AcquireInput,
    DrainInput,
    DrainResume,
    InterruptRequest,
    Outcome,
    ResumeRequest,
    workflow_id,
)
from store import Store
from tests.conftest import Target
from tests.invariants import assert_clean, final_log
from tests.workflows.harness import Harness, harness
from tests.workflows.tools import Gate, registry
from workflows.session import _stopped_by_interrupt


async def _carried(h: Harness, store: Store, sid: str) -> DrainInput:
    """The input of a run that continued a busy period as new: its claim is already held."""
    execution_id = f"exec_{uuid.uuid4().hex}"
    acquire = AcquireInput(
        session_id=sid,
        execution_id=execution_id,
        owner_id=f"{workflow_id(sid)}/{execution_id}",
    )
    claim = await SessionActivities(Runtime(store, registry(Gate()))).acquire_claim(acquire)
    resume = DrainResume(claim=claim, step=1)
    return DrainInput(session_id=sid, period=1, resume=resume)


def _start_options(h: Harness, sid: str) -> dict[str, object]:
    attributes = TypedSearchAttributes([SearchAttributePair(SESSION_ID_ATTRIBUTE, sid)])
    return {
        "id": workflow_id(sid),
        "task_queue": h.client.task_queue,
        "search_attributes": attributes,
    }


async def test_an_interrupt_in_a_continued_runs_first_activation_stops_it(
    h: Harness, store: Store
) -> None:
    sid = await h.session([{"text": "must not be asked for"}])
    carried = await _carried(h, store, sid)
    handle = await h.client.temporal.start_workflow(
        "SessionWorkflow",
        carried,
        start_signal="interrupt",
        start_signal_args=[InterruptRequest(reason="user")],
        **_start_options(h, sid),  # type: ignore[arg-type]
    )
    await handle.result()
    log = await final_log(store, sid)
    assert_clean(log)
    assert [e.data.type for e in log][-1] == "session.execution.interrupted"
    assert h.requests() == []  # the model was never asked


async def test_a_resume_in_a_continued_runs_first_activation_joins_its_busy_period(
    h: Harness, store: Store
) -> None:
    sid = await h.session([{"text": "answered once"}])
    carried = await _carried(h, store, sid)
    operation: WithStartWorkflowOperation[object, object] = WithStartWorkflowOperation(
        "SessionWorkflow",
        carried,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        **_start_options(h, sid),  # type: ignore[arg-type]
    )
    outcome = await h.client.temporal.execute_update_with_start_workflow(
        "resume", ResumeRequest(), start_workflow_operation=operation, result_type=Outcome
    )
    assert outcome.type == "succeeded"
    await h.client.wait_idle(sid, timeout=30)
    log = await final_log(store, sid)
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1  # no extra busy period was forced
    assert len(h.requests()) == 1


async def test_an_interrupt_while_waiting_for_the_claim_is_an_interrupt(
    h: Harness, store: Store
) -> None:
    sid = await h.session([{"text": "must not be asked for"}])
    # Another execution holds a live claim: the drain waits for its lease to expire.
    await store.claims.acquire(sid, "exec_other", "owner-other")
    await h.client.prompt(sid, "Go")

    async def claiming() -> bool:
        status = await h.client.status(sid)
        return status.drain is not None and status.drain.phase == "claiming"

    await h.until(claiming)
    # A resume joins the waiting busy period once the workflow accepted it.
    joined = await h.client._handle(sid).start_update(
        "resume",
        ResumeRequest(),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
        result_type=Outcome,
    )
    assert (await h.client.interrupt(sid)).status == "stopped"
    outcome = await asyncio.wait_for(joined.result(), 30)
    assert (outcome.type, outcome.reason, outcome.error) == ("interrupted", "user", None)
    assert h.requests() == []


async def test_an_interrupt_nobody_answers_says_it_was_only_sent(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        sid = await h.session([{"text": "x"}])
        await h.client.prompt(sid, "Go")  # the run exists; no worker polls its queue
        answer = await h.client.interrupt(sid)
    assert answer.status == "sent" and not answer


async def test_an_interrupt_during_a_local_activity_waits_for_it_and_interrupts(
    temporal_env: WorkflowEnvironment, postgres_target: Target, tmp_path: Path
) -> None:
    """``claim_and_prepare`` is held inside its transaction (another client locks the session's
    event sequence row, which its ``execution.started`` needs) until the interrupt has been
    accepted: cut off there, it used to roll back the claim and end the busy period failed
    "Cancelled"."""
    # A long lease: the acquisition then waits on the row lock longer than a workflow task lasts.
    store = await postgres_target.open(lease_ms=120_000)
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            sid = await h.session([{"text": "must not be asked for"}])
            await h.client.prompt(sid, "Go", wake=False)
            async with await psycopg.AsyncConnection.connect(_libpq(postgres_target)) as locker:
                await locker.execute(
                    f'SELECT 1 FROM "{postgres_target.schema}".event_sequence'
                    " WHERE aggregate_id = %s FOR UPDATE",
                    (sid,),
                )
                await h.client.wake(sid)
                await h.until(lambda: _someone_waits_for(locker), timeout=30)
                handle = h.client._handle(sid)
                await handle.signal("interrupt", InterruptRequest(reason="user"))
                # The local activity outlasts its workflow task, which hands over (a workflow
                # task heartbeat) with the interrupt delivered: only then is the lock let go.
                await h.until(lambda: _handled_after_signal(handle), timeout=60)
                await locker.rollback()
            await h.client.wait_idle(sid, timeout=60)
            log = await final_log(store, sid)
    finally:
        await store.close()
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types[-2:] == ["session.execution.started", "session.execution.interrupted"]
    assert h.requests() == []


async def _someone_waits_for(locker: psycopg.AsyncConnection[Any]) -> bool:
    """Another backend is blocked by ``locker`` (the acquisition, on the locked row). Not any
    ungranted lock in the cluster: tests running beside this one wait on locks of their own,
    and an interrupt sent before the wake has started a busy period cancels the wake (seen
    in a CI run: nothing was claimed and nothing written)."""
    blocked = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
    async with await psycopg.AsyncConnection.connect(locker.info.dsn) as probe:
        row = await (await probe.execute(blocked, (locker.info.backend_pid,))).fetchone()
    return bool(row and row[0])


async def _handled_after_signal(handle: Any) -> bool:
    """A workflow task completed after the interrupt signal: the workflow has seen it."""
    events = (await handle.fetch_history()).events
    kinds = [EventType.Name(e.event_type) for e in events]
    if "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED" not in kinds:
        return False
    signalled = max(i for i, k in enumerate(kinds) if k == "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED")
    return "EVENT_TYPE_WORKFLOW_TASK_COMPLETED" in kinds[signalled:]


def _libpq(target: Target) -> str:
    return target.url.replace("postgresql+psycopg://", "postgresql://", 1)


def test_a_claim_wait_ended_by_the_interrupt_is_the_interrupt_not_a_failure() -> None:
    """Cancelling ``acquire_claim`` during an attempt: the server stops its retries and reports
    that attempt's ``ClaimHeldError``, not a cancellation (seen once under load in CI)."""

    def failed(cause: BaseException) -> ActivityError:
        error = ActivityError(
            "activity failed",
            scheduled_event_id=1,
            started_event_id=2,
            identity="",
            activity_type="acquire_claim",
            activity_id="2",
            retry_state=None,
        )
        error.__cause__ = cause
        return error

    held = failed(ApplicationError("claimed by exec_other", type="ClaimHeldError"))
    assert _stopped_by_interrupt(held, claimed=False)
    assert not _stopped_by_interrupt(held, claimed=True)
    assert _stopped_by_interrupt(failed(CancelledError("cancelled")), claimed=True)
    lost = failed(ApplicationError("claim lost", type="ClaimLostError"))
    assert not _stopped_by_interrupt(lost, claimed=False)
