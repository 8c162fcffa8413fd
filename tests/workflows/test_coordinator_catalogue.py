"""Reference §7.1, the run coordinator's catalogue, in this product's terms: a busy period is one
``session.execution.started`` .. terminal of the session workflow; wakes and interrupts are its
signals and updates. (Other §7.1 cases live beside the drain: ``test_drain.py``.)

The terminal settlement is held at the boundary between Temporal and our activity: a worker
interceptor (through the client, as the tracing one travels) keeps ``finish_execution`` from
starting until the test lets it go. That local activity then outlasts its workflow task, so a
signal sent meanwhile reaches the workflow only with the task's heartbeat: these runs start
with short workflow tasks (2 s, heartbeat every 1.6 s) to keep the wait short. The hold is let
go only after the workflow took the signal: let go before, the task completes with the signal
still unseen, the server refuses it (``UnhandledCommand``) and the settlement's local activities
run a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput
from temporalio.worker import Interceptor as WorkerInterceptor

from sessionflow.client import SESSION_ID_ATTRIBUTE
from sessionflow.models.drain import DrainInput, WakeSignal, workflow_id
from store import Store
from tests.workflows.harness import Harness, harness

TERMINALS = (
    "session.execution.succeeded",
    "session.execution.failed",
    "session.execution.interrupted",
)


class HoldsTerminal(ClientInterceptor, WorkerInterceptor):
    """Holds the next ``finish_execution`` (the busy period's terminal) before it runs, until
    ``release()``; ``held`` is set once it waits."""

    def __init__(self) -> None:
        self.armed = True
        self.held = asyncio.Event()
        self.released = asyncio.Event()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Holding(next, self)

    def release(self) -> None:
        self.released.set()


class _Holding(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, hold: HoldsTerminal) -> None:
        super().__init__(next)
        self.hold = hold

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if self.hold.armed and activity.info().activity_type == "finish_execution":
            self.hold.armed = False
            self.hold.held.set()
            await self.hold.released.wait()
        return await super().execute_activity(input)


@asynccontextmanager
async def holding(
    temporal_env: WorkflowEnvironment, store: Store, root: Path
) -> AsyncIterator[tuple[Harness, HoldsTerminal]]:
    hold = HoldsTerminal()
    config = temporal_env.client.config()
    config["interceptors"] = [hold]
    client = Client(**config)
    try:
        async with harness(client, store, root) as h:
            yield h, hold
    finally:
        hold.release()  # never leave the worker's activity waiting on the way out


async def start_with_short_tasks(h: Harness, sid: str) -> None:
    """``SessionClient.wake``, with 2 s workflow tasks (see the module docstring)."""
    await h.client.temporal.start_workflow(
        "SessionWorkflow",
        DrainInput(session_id=sid),
        id=workflow_id(sid),
        task_queue=h.client.task_queue,
        start_signal="wake",
        start_signal_args=[WakeSignal()],
        search_attributes=TypedSearchAttributes([SearchAttributePair(SESSION_ID_ATTRIBUTE, sid)]),
        task_timeout=timedelta(seconds=2),
    )


async def took_signal(h: Harness, sid: str, name: str, count: int) -> bool:
    """The ``count``-th ``name`` signal is in the history and a workflow task completed after
    it: the workflow has taken it. (A signal sent while a workflow task is open is written
    only once that task ends: counting them tells this one from the start's.)"""
    events = (await h.client._handle(sid).fetch_history()).events
    signalled = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == name
    ]
    return len(signalled) >= count and any(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        for e in events[signalled[count - 1] :]
    )


async def terminals(h: Harness, sid: str) -> list[tuple[str, str | None]]:
    """Each busy period's terminal event and its interrupt reason, in order."""
    return [(e.type, e.data.get("reason")) for e in await h.events(sid) if e.type in TERMINALS]


async def test_11_a_late_interrupt_during_the_terminal_settlement_is_not_attached(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """An interrupt that arrives while the busy period's terminal is being written changes
    neither that terminal nor the next busy period (reference reasons ``[undefined,
    undefined]``: here two ``succeeded`` terminals, no interrupt reason)."""
    async with holding(temporal_env, store, tmp_path) as (h, hold):
        sid = await h.session([{"text": "first"}], [{"text": "second"}])
        await h.client.prompt(sid, "One", wake=False)
        await start_with_short_tasks(h, sid)
        await asyncio.wait_for(hold.held.wait(), 30)
        # The workflow answers while its terminal is still held: too late to interrupt.
        assert (await h.client.interrupt(sid)).status == "idle"
        assert await terminals(h, sid) == []  # nothing of the terminal was written yet
        hold.release()
        await h.until(lambda: _terminal_count(h, sid, 1), timeout=30)
        await h.client.prompt(sid, "Two", wake=False)
        outcome = await h.client.resume(sid)
        assert (outcome.type, outcome.reason) == ("succeeded", None)
        await h.client.wait_idle(sid, timeout=30)
        assert await terminals(h, sid) == [
            ("session.execution.succeeded", None),
            ("session.execution.succeeded", None),
        ]
        assert len(h.requests()) == 2


async def test_14_a_wake_during_interruption_cleanup_starts_a_successor_busy_period(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """A prompt woken while the interrupted busy period settles (its terminal held) is not
    claimed by that interrupt: a successor busy period runs it (2 ``execution.started``)."""
    async with holding(temporal_env, store, tmp_path) as (h, hold):
        sid = await h.session(
            [{"text": "partial"}, {"wait_for_file": h.gate_file("never")}],
            [{"text": "successor"}],
        )
        await h.client.prompt(sid, "One", wake=False)
        await start_with_short_tasks(h, sid)
        await h.until(lambda: len(h.requests()) == 1)
        assert (await h.client.interrupt(sid)).status == "stopped"
        await asyncio.wait_for(hold.held.wait(), 30)
        await h.client.prompt(sid, "Two")  # a wake signal to the run still settling
        # Taken by the workflow task's heartbeat while the terminal is still held.
        await h.until(lambda: took_signal(h, sid, "wake", 2), timeout=30)
        assert await terminals(h, sid) == []  # the interrupted period has not ended yet
        hold.release()
        await h.until(lambda: _terminal_count(h, sid, 2), timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        events = await h.events(sid)
        started = [e.data["execution_id"] for e in events if e.type == "session.execution.started"]
        assert len(started) == 2 and started[0] != started[1]
        assert await terminals(h, sid) == [
            ("session.execution.interrupted", "user"),
            ("session.execution.succeeded", None),
        ]
        requests = h.requests()
        assert len(requests) == 2
        users = [m["content"][0]["text"] for m in requests[1]["messages"] if m["role"] == "user"]
        assert users == ["One", "Two"]


async def _terminal_count(h: Harness, sid: str, count: int) -> bool:
    return len(await terminals(h, sid)) == count


async def test_a_joiner_is_told_the_logged_terminal_when_the_settling_task_runs_again(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """The wake of #14 reaching the server while the interrupted period's settlement still
    runs, not yet taken: the workflow task that wrote the terminal (and released the claim)
    is refused, and its retry runs the settlement again, against the released claim. The
    caller that joined the period is told the terminal the log holds (interrupted, by the
    user), not that refusal; the log has one terminal per period, and the successor runs."""
    async with holding(temporal_env, store, tmp_path) as (h, hold):
        sid = await h.session(
            [{"text": "partial"}, {"wait_for_file": h.gate_file("never")}],
            [{"text": "successor"}],
        )
        await h.client.prompt(sid, "One", wake=False)
        await start_with_short_tasks(h, sid)
        await h.until(lambda: len(h.requests()) == 1)
        joined = await h.client._start_resume(sid)  # accepted: it joined the running period
        assert (await h.client.interrupt(sid)).status == "stopped"
        await asyncio.wait_for(hold.held.wait(), 30)
        await h.client.prompt(sid, "Two")  # reaches the server while the settlement runs
        hold.release()  # before the workflow took it: the task that settles is refused
        outcome = await asyncio.wait_for(joined.result(), 60)
        assert (outcome.type, outcome.reason, outcome.error) == ("interrupted", "user", None)
        await h.until(lambda: _terminal_count(h, sid, 2), timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        assert await terminals(h, sid) == [
            ("session.execution.interrupted", "user"),
            ("session.execution.succeeded", None),
        ]
        assert len(h.requests()) == 2
