"""Reliability catalogue cases that need a drain on a real Temporal server of their own (or a
store made to fail under it). Each test names its case; docs/reliability.md lists them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from sessionflow.client import MAX_ACTIVE_TOOLS, SESSION_ID_ATTRIBUTE
from sessionflow.devstack import dev_server_args
from sessionflow.errors import InvalidIdError
from sessionflow.models.common import SessionError
from sessionflow.models.drain import workflow_id
from store import Store
from store.schema import execution_table
from tests.conftest import Target, start_dev_server, temporal_binary
from tests.invariants import TOOL_TERMINALS, assert_clean, final_log
from tests.workflows.harness import Harness, call, harness
from tests.workflows.workers import WorkerProcess
from workflows import session as session_workflow
from workflows.options import Options

PENDING_LIMIT = 6  # Temporal's default is 2,000 pending activities per workflow


@pytest.fixture(scope="module")
async def few_pending_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server(f"limit.numPendingActivities.error={PENDING_LIMIT}")
    yield env
    await env.shutdown()


async def test_a_turn_with_more_calls_than_temporal_lets_pend_runs_every_one(
    few_pending_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """D6: a turn with more tool calls than Temporal allows pending activities (here a server
    that allows 6, as the default allows 2,000) runs every call: the workflow schedules a tool
    only when one of the session's ``max_active_tools`` slots is free, so the turn activity plus
    the running tools never reach the limit. Without that gate the server fails the workflow
    task ("PendingActivitiesLimitExceeded") and the session never ends."""
    calls = [call(f"c{i:02d}", "echo", text=str(i)) for i in range(4 * PENDING_LIMIT)]
    async with harness(few_pending_env.client, store, tmp_path) as h:
        sid = await h.session(calls, [{"text": "all done"}], max_active_tools=PENDING_LIMIT - 2)
        await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid, timeout=120)
        log = await final_log(store, sid)
    assert_clean(log)
    settled = [e.data.call_id for e in log if e.data.type in TOOL_TERMINALS]
    assert sorted(settled) == sorted(c["tool_call"]["id"] for c in calls)
    assert [e.data.type for e in log][-1] == "session.execution.succeeded"


async def test_the_tool_cap_stays_below_temporals_pending_activity_limit(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """D6: a session cannot be given a cap that would let its tools alone reach the limit."""
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        with pytest.raises(ValueError, match="max_active_tools must be between 1 and 1000"):
            await h.session([{"text": "x"}], max_active_tools=MAX_ACTIVE_TOOLS + 1)
        assert await h.session([{"text": "x"}], max_active_tools=MAX_ACTIVE_TOOLS)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _dev_server(port: int, database: Path) -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_local(
        port=port,
        dev_server_database_filename=str(database),
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=[SESSION_ID_ATTRIBUTE],
        dev_server_log_level="error",
        dev_server_extra_args=dev_server_args(),
    )


@pytest.mark.fault
async def test_the_temporal_server_restarted_mid_drain_finishes_the_session(
    store: Store, tmp_path: Path
) -> None:
    """C5: the Temporal dev server (on a database file, ``--db-filename``) is stopped while a
    model turn streams and started again on the same address. The worker and the client keep
    their connections (the SDK reconnects); the busy period finishes under its one claim with
    the same log an uninterrupted run writes."""
    port, database = _free_port(), tmp_path / "temporal.db"
    first = await _dev_server(port, database)
    second: WorkflowEnvironment | None = None
    try:
        async with harness(first.client, store, tmp_path) as h:
            gate = h.gate_file("stream")
            sid = await h.session(
                [
                    {"text": "before "},
                    {"wait_for_file": gate},
                    {"text": "after"},
                    call("c1", "echo", text="tool ran"),
                ],
                [{"text": "done"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
            await first.shutdown()
            second = await _dev_server(port, database)
            h.open_gate("stream")
            await h.client.wait_idle(sid, timeout=120)
            log = await final_log(store, sid)
    finally:
        if second is not None:
            await second.shutdown()
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1
    assert types[-1] == "session.execution.succeeded"
    assert len({(e.execution_id, e.epoch) for e in log if e.execution_id}) == 1
    texts = [
        "".join(getattr(part, "text", "") for part in m.content)
        for m in await store.sessions.messages(sid)
        if m.type == "assistant"
    ]
    assert texts == ["before after", "done"]
    assert "session.tool.success" in types


async def _has(h: Harness, sid: str, kind: str) -> bool:
    return kind in await h.types(sid, deltas=True)


@pytest.mark.fault
async def test_a_poison_call_that_kills_every_worker_is_bounded_and_holds_no_one_back(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """C9 (and C12, worker churn): one session's tool call kills the worker process that runs
    it, every time. A supervisor keeps two workers on the queue, starting one whenever one
    dies, while other sessions run on the same workers. The poison call is tried a bounded
    number of times (the tool activity's retry policy), then settles failed and its busy period
    ends failed; every other session finishes; no log breaks an invariant. On PostgreSQL only:
    the store several worker processes share in production (the case is the workflow's)."""
    crashes, target = tmp_path / "crashes.log", postgres_target
    store = await target.open()
    try:
        await _poison_run(temporal_env, store, target, tmp_path, workers, crashes)
    finally:
        await store.close()


async def _poison_run(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
    crashes: Path,
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        queue = h.client.task_queue

        async def spawn() -> WorkerProcess:
            worker = WorkerProcess(temporal_env, target, queue)
            workers.append(worker)
            await worker.ready()
            return worker

        async def supervise() -> None:
            alive = [await spawn(), await spawn()]
            while True:
                for i, worker in enumerate(alive):
                    if worker.process.poll() is not None:
                        alive[i] = await spawn()
                await asyncio.sleep(0.1)

        supervisor = asyncio.create_task(supervise())
        try:
            poison = h.script(
                [call("p1", "crash", log=str(crashes))], [{"text": "gave up"}], name="poison.json"
            )
            sid = await h.client.create_session(workspace=str(h.workspace), model=poison)
            healthy = []
            for n in range(3):
                model = h.script(
                    [call(f"e{n}{i}", "echo", text=f"{n}.{i}") for i in range(3)],
                    [{"text": f"healthy {n}"}],
                    name=f"healthy{n}.json",
                )
                healthy.append(
                    await h.client.create_session(workspace=str(h.workspace), model=model)
                )
            await h.client.prompt(sid, "Go")
            await h.until(crashes.exists, timeout=30)  # the poison is killing workers now
            for other in healthy:
                await h.client.prompt(other, "Go")
            for other in healthy:
                await h.client.wait_idle(other, timeout=120)
            await h.client.wait_idle(sid, timeout=180)
        finally:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        for other in healthy:
            log = await final_log(store, other)
            assert_clean(log)
            assert log[-1].data.type == "session.execution.succeeded"
        log = await final_log(store, sid)
    assert_clean(log)
    assert len(crashes.read_text().split()) == 3  # the tool activity's maximum attempts
    [settled] = [e for e in log if e.data.type in TOOL_TERMINALS]
    assert settled.data.type == "session.tool.failed"
    # Moved to failed (the catalogue's dead-letter state), not crash-looping: a later prompt
    # starts afresh.
    assert log[-1].data.type == "session.execution.failed"
    assert "heartbeat timeout" in log[-1].data.error.message.lower()


@pytest.mark.breaks_invariants("I5")  # the successor is the test's own claim: it writes nothing
async def test_a_run_whose_claim_another_execution_holds_ends_without_writing(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """F9: the Temporal run and the database claim disagree. While run R1 streams a turn, its
    claim lapses and another execution (R2) takes the session. R1's turn fails with a
    non-retryable ``ClaimLostError`` (tried once: Temporal does not retry it) and R1's busy
    period ends without writing a single event after the takeover."""
    async with harness(temporal_env.client, store, tmp_path, breaks={"I5"}) as h:
        gate = h.gate_file("after-takeover")
        sid = await h.session([{"text": "streamed "}, {"wait_for_file": gate}, {"text": "late"}])
        await h.client.prompt(sid, "Go")
        await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
        first = await store.claims.current(sid)
        assert first is not None
        async with store.db.write() as tx:  # R1's lease runs out (a paused or partitioned run)
            await tx.conn.execute(
                sa.update(execution_table)
                .where(execution_table.c.session_id == sid)
                .values(expires_at=0)
            )
        successor = await store.claims.acquire(sid, "exec_r2", "owner-r2")
        taken_at = await store.events.latest_sequence(sid)
        h.open_gate("after-takeover")
        await h.until(lambda: _idle(h, sid), timeout=60)
        late = [e for e in await h.events(sid) if e.seq > taken_at]
        history = await h.client._handle(sid).fetch_history()
    assert late == [], [e.type for e in late]
    assert successor.epoch == first.epoch + 1
    failures = [
        e.activity_task_failed_event_attributes.failure
        for e in history.events
        if e.HasField("activity_task_failed_event_attributes")
    ]
    assert failures, "R1's turn did not fail"
    info = failures[0].application_failure_info
    assert (info.type, info.non_retryable) == ("ClaimLostError", True)
    started = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    assert [e.activity_task_started_event_attributes.attempt for e in started] == [1]


async def _idle(h: Harness, sid: str) -> bool:
    return not (await h.client.status(sid)).busy


def test_every_activity_has_a_bound_that_finds_a_lost_task() -> None:
    """C7: a lost activity task (its worker died after polling it, before or while running it,
    or no worker ever took it) never hangs the workflow. Every activity the workflow runs has
    a start-to-close timeout, and a schedule-to-close one that bounds its attempts, retry
    waits and time in the queue together; every remote one that may run longer than a minute
    heartbeats within seconds, so the server notices a lost task and retries it (or fails it
    to the workflow) long before its start-to-close. The crash tests (C1, C3) show the retry
    itself; this checks that no activity is without the bounds."""
    options = {
        name: value for name, value in vars(session_workflow).items() if isinstance(value, Options)
    }
    assert {"SHORT", "CLAIM", "CLAIM_AT_ONCE", "TURN", "COMPACT", "TOOL", "REVERT"} <= set(options)
    for name, option in options.items():
        assert timedelta(0) < option.start_to_close <= timedelta(hours=2), name
        assert option.schedule_to_close is not None, f"{name} has no schedule-to-close bound"
        assert option.start_to_close <= option.schedule_to_close <= timedelta(hours=8), name
        if not option.local and option.start_to_close > timedelta(minutes=1):
            assert option.heartbeat is not None, f"{name} runs long without a heartbeat"
            assert option.heartbeat <= timedelta(seconds=10), name


async def test_a_claim_held_past_the_workers_bound_fails_typed_and_keeps_the_input(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """C7: the claim's retries are bounded. Another live execution holds the claim longer
    than the worker's ``claim_wait_s``: the busy period fails with a ``claim.timeout`` error
    naming the holder and the setting, writes nothing (it never had the claim), and keeps the
    prompt, which the next busy period runs once the holder is gone."""
    async with harness(temporal_env.client, store, tmp_path, claim_wait_s=2) as h:
        sid = await h.session([{"text": "after the wait"}])
        other = await h.store.claims.acquire(sid, "exec_other", "owner-other", lease_ms=600_000)
        await h.client.prompt(sid, "Go", wake=False)
        outcome = await h.client.resume(sid)
        assert outcome.type == "failed" and outcome.error is not None
        assert outcome.error.type == "claim.timeout"
        assert "exec_other" in outcome.error.message
        assert "SESSIONFLOW_CLAIM_WAIT_S" in outcome.error.message
        assert h.requests() == [] and "session.execution.started" not in await h.types(sid)
        assert [i.prompt.text for i in await h.store.inputs.pending(sid) if i.prompt] == ["Go"]
        await h.store.claims.release(other)
        assert (await h.client.resume(sid)).type == "succeeded"
        assert len(h.requests()) == 1


LEASE_MS = 2000


@pytest.mark.parametrize("stall", [0.5, 1.5])
async def test_an_event_loop_stalled_past_its_lease_fences_its_worker(
    temporal_env: WorkflowEnvironment, target: Target, tmp_path: Path, stall: float
) -> None:
    """F4: a tool blocks its worker's event loop (renewals included) for 0.5x and then 1.5x
    the lease. 0.5x: the claim survives and the busy period succeeds under it. 1.5x: the
    claim expired meanwhile; the worker cannot renew it, writes nothing more under it, and the
    session's next busy period takes it with a new epoch and settles the stalled call."""
    store = await target.open(lease_ms=LEASE_MS)
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            sid = await h.session(
                [call("s1", "stall", seconds=stall * LEASE_MS / 1000)],
                [{"text": "after the stall"}],
                [{"text": "next prompt"}],
            )
            await h.client.prompt(sid, "Go")
            await h.client.wait_idle(sid, timeout=60)
            if stall > 1:
                await h.client.prompt(sid, "Again")
                await h.client.wait_idle(sid, timeout=60)
            log = await final_log(store, sid)
    finally:
        await store.close()
    assert_clean(log)
    types = [e.data.type for e in log]
    stamps = sorted({(e.epoch, e.execution_id) for e in log if e.execution_id})
    if stall < 1:
        assert len(stamps) == 1 and types[-1] == "session.execution.succeeded"
        assert "session.tool.success" in types
        return
    (_, stalled), (_, successor) = stamps
    called = next(e.seq for e in log if e.data.type == "session.tool.called")
    assert [e for e in log if e.execution_id == stalled and e.seq > called] == []
    [settled] = [e for e in log if e.data.type in TOOL_TERMINALS]
    assert (settled.data.type, settled.execution_id) == ("session.tool.failed", successor)
    assert types[-1] == "session.execution.succeeded"


@pytest.mark.parametrize("cap", [1, 4, 8])
async def test_fifty_calls_run_at_most_cap_at_once_and_settle_in_call_order(
    h: Harness, cap: int
) -> None:
    """S10: 50 tool calls in one turn with a cap of 1, 4 and 8. The gate tool counts how many
    run at once: exactly ``cap`` (held until the test saw it), never more; every call settles
    once; whatever order they finish in, the assistant message and the next request list the
    results by call index."""
    gate = h.gate_file("fifty")
    calls = [call(f"call_{i:02d}", "gate", text=str(i), gate=gate) for i in range(50)]
    sid = await h.session(calls, [{"text": "all settled"}], max_active_tools=cap)
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == cap, timeout=30)
    h.open_gate("fifty")
    await h.client.wait_idle(sid, timeout=120)
    log = await final_log(h.store, sid)
    assert_clean(log)
    assert h.gate.peak == cap
    settled = [e.data.call_id for e in log if e.data.type in TOOL_TERMINALS]
    assert sorted(settled) == [f"call_{i:02d}" for i in range(50)]
    assistant = next(m for m in await h.store.sessions.messages(sid) if m.type == "assistant")
    parts = [getattr(part, "call_id", None) for part in assistant.content]
    assert [p for p in parts if p] == [f"call_{i:02d}" for i in range(50)]
    results = [m for m in h.requests()[-1]["messages"] if m["role"] == "tool"]
    ids = [part.get("call_id") or part.get("id") for m in results for part in m["content"]]
    assert ids == [f"call_{i:02d}" for i in range(50)], ids[:5]


async def test_a_prompt_sent_three_times_at_once_is_one_message_in_one_run(h: Harness) -> None:
    """S9: the same prompt (one input id) sent three times at once through the client, each
    admitting it and waking the session (signal-with-start): one admission, one user message,
    one model request, and every wake lands in the one workflow run the first started."""
    sid = await h.session([{"text": "once"}], [{"text": "a second answer nobody asked for"}])
    receipts = await asyncio.gather(
        *(h.client.prompt(sid, "Go", input_id="msg_dup") for _ in range(3))
    )
    await h.client.wait_idle(sid, timeout=30)
    assert {r.id for r in receipts} == {"msg_dup"}
    assert len({r.admitted_seq for r in receipts}) == 1
    types = await h.types(sid)
    assert types.count("session.prompt.admitted") == 1
    users = [m for m in await h.store.sessions.messages(sid) if m.type == "user"]
    assert [m.text for m in users] == ["Go"]
    assert len(h.requests()) == 1
    handle = h.client._handle(sid)
    described = await handle.describe()
    history = await handle.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert described.run_id == started.first_execution_run_id  # one run, the first
    signals = [
        e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    names = [s.workflow_execution_signaled_event_attributes.signal_name for s in signals]
    assert names == ["wake", "wake", "wake"]  # all three wakes reached the one run


async def test_the_longest_valid_session_id_runs_under_a_workflow_id_temporal_accepts(
    h: Harness,
) -> None:
    """D3: the Temporal workflow id of the longest valid session id (128 characters) stays far
    under the server's limit of 1,000 characters, which this server enforces (an id of 1,001 is
    refused); a session of that id runs a turn under it, and one character more is refused
    before anything is written."""
    sid = f"ses_{uuid.uuid4().hex}".ljust(128, "x")  # fresh in the shared server
    with pytest.raises(InvalidIdError):
        await h.session([{"text": "never"}], session_id=sid + "x")
    assert await h.session([{"text": "done"}], session_id=sid) == sid
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    described = await h.client._handle(sid).describe()
    assert described.id == workflow_id(sid) and len(described.id) <= 1000
    assert (await h.types(sid))[-1] == "session.execution.succeeded"
    with pytest.raises(RPCError, match="exceeds maximum allowed length"):
        await h.client.temporal.start_workflow(
            "SessionWorkflow", id="w" * 1001, task_queue=f"tq-{uuid.uuid4()}"
        )


async def test_a_provider_that_keeps_failing_is_retried_up_to_the_cap_then_fails_the_step_once(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """P8: the attempt cap reached. A scripted provider fails every request with a retryable
    transport error: the drain asks it 1 + ``MAX_RETRIES`` times, each retry scheduled once
    (attempts 2 to 5, the error named) and each after the one before with the backoff doubling,
    then the step fails once with that error, the busy period fails, and no request follows.
    The worker's backoff setting (``SESSIONFLOW_RETRY_BACKOFF_MS``) is 0.1 s here, not 2 s."""
    async with harness(temporal_env.client, store, tmp_path, retry_backoff_ms=100) as h:
        await _keep_failing(h, backoff_ms=100)


async def _keep_failing(h: Harness, *, backoff_ms: int) -> None:
    unavailable = {"error": {"kind": "transport", "message": "Provider unavailable"}}
    attempts = 1 + session_workflow.MAX_RETRIES
    sid = await h.session(*([unavailable] for _ in range(attempts)), [{"text": "never"}])
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    transport = SessionError(type="provider.transport", message="Provider unavailable")
    assert (outcome.type, outcome.error) == ("failed", transport)
    assert len(h.requests()) == attempts
    events = await h.events(sid)
    retries = [e.data for e in events if e.type == "session.retry.scheduled"]
    assert [r["attempt"] for r in retries] == list(range(2, attempts + 1))
    assert {r["error"]["type"] for r in retries} == {"provider.transport"}
    # Each retry is scheduled once the timer before it fired (the workflow's clock).
    gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(retries)]
    assert all(gap >= backoff_ms * 2 ** (i + 1) for i, gap in enumerate(gaps)), gaps
    types = [e.type for e in events]
    assert types.count("session.step.started") == attempts
    assert types.count("session.step.failed") == 1
    assert types[-1] == "session.execution.failed"
    (assistant,) = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert (assistant.finish, assistant.error) == ("error", transport)


@pytest.mark.fault
async def test_a_deploy_during_tools_reruns_the_safe_call_and_settles_the_other(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """C8: SIGTERM (a deploy, 1 s of grace) of the worker running two tools, another worker on
    the queue. The worker stops within its grace and exits 0; the retry-safe call runs again on
    the other worker and succeeds, the other (``sleep`` is not retry-safe) is settled failed and
    the model told; the busy period finishes under its one claim. On PostgreSQL, the store
    worker processes share in production (the case is the workflow's and the worker's)."""
    store = await postgres_target.open()
    try:
        await _deploy_during_tools(temporal_env, store, postgres_target, tmp_path, workers)
    finally:
        await store.close()


async def _deploy_during_tools(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    gate = str(tmp_path / "tools-go")
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        first = WorkerProcess(
            temporal_env, target, h.client.task_queue, SESSIONFLOW_TEST_GRACE_S="1"
        )
        workers.append(first)
        await first.ready()
        sid = await h.session(
            [call("safe", "gate", text="ran", gate=gate), call("unsafe", "sleep", until_file=gate)],
            [{"text": "both settled"}],
        )
        await h.client.prompt(sid, "Go")
        await h.until(lambda: _running(h, sid, 2), timeout=30)
        second = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(second)
        await second.ready()
        first.signal(signal.SIGTERM)
        assert await first.exited() == 0
        Path(gate).touch()
        await h.client.wait_idle(sid, timeout=90)
        log = await final_log(store, sid)
    assert_clean(log)
    outcomes = {e.data.call_id: e.data.type for e in log if e.data.type in TOOL_TERMINALS}
    assert outcomes == {"safe": "session.tool.success", "unsafe": "session.tool.failed"}
    assert [e.data.type for e in log][-1] == "session.execution.succeeded"
    assert len({(e.execution_id, e.epoch) for e in log if e.execution_id}) == 1


async def _running(h: Harness, sid: str, count: int) -> bool:
    status = await h.client.status(sid)
    return status.drain is not None and len(status.drain.running_tools) >= count


RESTARTS = 20


def _churn_script(h: Harness, n: int) -> str:
    """A session's model: a paced text turn with three calls (one long enough to be cut off),
    a second call turn, and final answers (a turn cut off by a restart is asked again, and the
    scripted model answers each request with its next turn)."""
    paced = itertools.chain.from_iterable(
        ({"text": f"s{n} part {k} "}, {"wait_ms": 150}) for k in range(4)
    )
    return h.script(
        [
            *paced,
            call(f"a{n}", "echo", text=f"{n}.a"),
            call(f"b{n}", "sleep", seconds=0.8, text=f"{n}.b"),
            call(f"c{n}", "echo", text=f"{n}.c"),
        ],
        [{"text": f"s{n} again"}, {"wait_ms": 300}, call(f"d{n}", "echo", text=f"{n}.d")],
        *([{"text": f"s{n} done"}] for _ in range(RESTARTS)),
        name=f"churn{n}.json",
    )


@pytest.mark.fault
async def test_workers_restarted_every_half_to_two_seconds_lose_no_call_of_twenty_sessions(
    temporal_env: WorkflowEnvironment,
    postgres_target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """C12, worker restart churn: worker processes serve the queue while, 20 times, every 0.5
    to 2 s (a seeded draw) after the last restart was ready, one of them is restarted: killed
    by SIGKILL (a crash) or SIGTERM with a 0.5 s grace (a deploy), alternately, and replaced by
    one started meanwhile, while 20 sessions run (one more is prompted after each restart, so
    every restart meets sessions streaming and running tools). Every session's busy period
    succeeds, with its final answer stored; no tool call is lost: every call the model made is
    settled exactly once (checker, I2/I3); one claim stamp per busy period. PostgreSQL, the
    store several workers share in production."""
    rng = random.Random(12)
    store = await postgres_target.open()
    try:
        async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:

            def start() -> WorkerProcess:
                queue, grace = h.client.task_queue, "0.5"
                worker = WorkerProcess(
                    temporal_env, postgres_target, queue, SESSIONFLOW_TEST_GRACE_S=grace
                )
                workers.append(worker)
                return worker

            alive, spare = [start(), start()], start()
            for worker in alive:
                await worker.ready()
            sessions = [
                await h.client.create_session(workspace=str(h.workspace), model=_churn_script(h, n))
                for n in range(RESTARTS)
            ]
            await h.client.prompt(sessions[0], "Go")
            for n in range(RESTARTS):
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                victim = alive.pop(rng.randrange(len(alive)))
                victim.signal(signal.SIGKILL if n % 2 == 0 else signal.SIGTERM)
                await spare.ready()
                alive.append(spare)
                spare = start()
                assert await victim.exited() in (0, -signal.SIGKILL)
                if n + 1 < RESTARTS:
                    await h.client.prompt(sessions[n + 1], "Go")
            for sid in sessions:
                await h.client.wait_idle(sid, timeout=180)
            logs = {sid: await final_log(store, sid) for sid in sessions}
            answers = [await _last_answer(store, sid) for sid in sessions]
    finally:
        await store.close()
    cut_off = 0
    for n, (sid, log) in enumerate(logs.items()):
        assert_clean(log)
        types = [e.data.type for e in log]
        assert types[-1] == "session.execution.succeeded", (sid, types[-5:])
        assert types.count("session.execution.started") == 1
        called = sorted(e.data.call_id for e in log if e.data.type == "session.tool.called")
        settled = sorted(e.data.call_id for e in log if e.data.type in TOOL_TERMINALS)
        assert settled == called  # every call the model made settled once: none lost
        assert set(called) <= {f"{c}{n}" for c in "abcd"}
        assert len({(e.execution_id, e.epoch) for e in log if e.execution_id}) == 1
        cut_off += types.count("session.step.failed")
    assert answers == [f"s{n} done" for n in range(RESTARTS)]
    assert cut_off > 0  # the restarts did meet running turns


async def _last_answer(store: Store, sid: str) -> str:
    *_, last = [m for m in await store.sessions.messages(sid) if m.type == "assistant"]
    return "".join(getattr(part, "text", "") for part in last.content)
