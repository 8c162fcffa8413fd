"""Crashes, pauses and abandoned drains: the session carries on, and stale writers are fenced."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from temporalio.testing import WorkflowEnvironment

from activities.session import BUDGET_MESSAGE, RESTART_TEXT
from sessionflow.client import SESSION_ID_ATTRIBUTE
from sessionflow.errors import ClaimLostError
from sessionflow.models import events as ev
from sessionflow.models.drain import SweepInput, SweepResult
from store import Store
from store.claims import Claim
from store.events import StoredEvent
from tests.conftest import StoreFactory, Target
from tests.invariants import UNSETTLED
from tests.store.helpers import expire_claim
from tests.workflows.harness import Harness, call, harness
from tests.workflows.operator_actions import reset_workflow
from tests.workflows.workers import (
    WorkerProcess,
    live_with,
    outside_a_write,
    recorded_in,
    sleep_marker,
)
from workflows.options import TOOL


async def sweep(h: Harness, env: WorkflowEnvironment) -> SweepResult:
    return await env.client.execute_workflow(
        "RecoverySweep",
        SweepInput(),
        id=f"sweep-{uuid.uuid4()}",
        task_queue=h.client.task_queue,
        result_type=SweepResult,
    )


async def abandon_mid_tool(h: Harness, sid: str) -> None:
    """Terminate the drain while its tool runs, then let its claim expire (moved back, not
    waited for: a lease short enough to wait out also expires under a busy machine's load)."""
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    await h.client._handle(sid).terminate("simulated loss of the drain")
    await h.until(lambda: h.gate.active == 0)
    await expire_claim(h.store, sid)
    assert await _expired(h.store, sid)


async def _expired(store: Store, sid: str) -> bool:
    return sid in await store.claims.expired(phases=("unknown", "continue"))


@pytest.fixture
async def short_lease(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> AsyncIterator[Harness]:
    store = await open_test_store(lease_ms=1500)
    async with harness(temporal_env.client, store, tmp_path) as running:
        yield running


async def test_the_sweep_recovers_a_drain_terminated_mid_turn(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    sid = await h.session(
        [call("call_1", "gate", gate=h.gate_file("never"))], [{"text": "continued"}]
    )
    await abandon_mid_tool(h, sid)
    result = await sweep(h, temporal_env)
    assert result.woken == (sid,)
    await h.until(lambda: len(h.requests()) == 2, timeout=30)
    await h.client.wait_idle(sid, timeout=30)
    messages = await h.messages(sid)
    first = next(m for m in messages if m.type == "assistant")
    stale = first.tool("call_1").state.error
    assert (stale.type, stale.message) == ("tool.stale", "Tool execution interrupted: gate")
    synthetic = [m for m in messages if m.type == "synthetic"]
    assert [m.text for m in synthetic] == [RESTART_TEXT]
    assert h.roles(h.requests()[1]) == ["user", "assistant", "tool", "user"]
    types = await h.types(sid)
    assert types.count("session.execution.started") == 2
    assert types.count("session.execution.succeeded") == 1
    assert await h.store.claims.current(sid) is None
    assert (await sweep(h, temporal_env)).woken == ()


async def test_each_deployment_in_a_namespace_sweeps_its_own_sessions(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> None:
    """Issue 32: the sweep's Schedule was one per namespace, on the first worker's queue: a
    second deployment (another task queue and store) got none, its abandoned drains stayed
    abandoned. Each deployment's Schedule now recovers its own."""
    from worker import ensure_sweep_schedule

    async with contextlib.AsyncExitStack() as stack:
        deployments: list[tuple[Harness, str]] = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            store = await open_test_store()
            h = await stack.enter_async_context(
                harness(temporal_env.client, store, tmp_path / name)
            )
            sid = await h.session(
                [call("call_1", "gate", gate=h.gate_file("never"))], [{"text": "continued"}]
            )
            await abandon_mid_tool(h, sid)
            deployments.append((h, sid))
        schedules = [
            await ensure_sweep_schedule(
                temporal_env.client,
                store=h.store,
                task_queue=h.client.task_queue,
                every=timedelta(seconds=1),
            )
            for h, _ in deployments
        ]
        assert len(set(schedules)) == 2
        try:
            for h, sid in deployments:
                await h.until(lambda h=h: len(h.requests()) == 2, timeout=60)
                await h.client.wait_idle(sid, timeout=30)
                assert (await h.types(sid)).count("session.execution.succeeded") == 1
        finally:
            for schedule in schedules:
                await temporal_env.client.get_schedule_handle(schedule).delete()


async def test_a_drain_the_sweep_starts_carries_the_session_id_search_attribute(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    sid = await h.session(
        [call("call_1", "gate", gate=h.gate_file("never"))], [{"text": "continued"}]
    )
    await abandon_mid_tool(h, sid)
    abandoned = (await h.client._handle(sid).describe()).run_id
    assert (await sweep(h, temporal_env)).woken == (sid,)
    swept = await h.client._handle(sid).describe()
    assert swept.run_id != abandoned
    assert swept.typed_search_attributes.get(SESSION_ID_ATTRIBUTE) == sid
    await h.client.wait_idle(sid, timeout=30)


async def test_the_resume_budget_ends_a_crash_looping_turn(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """Catalogue C9: a poison session."""
    sid = await h.session([call("call_1", "gate", gate=h.gate_file("never"))], [{"text": "x"}])
    await abandon_mid_tool(h, sid)
    async with h.store.db.write() as tx:
        # Ten earlier deaths of this turn were already counted.
        await tx.conn.execute(
            sa.text(
                "INSERT INTO session_recovery (session_id, execution_id, phase, wake_pending,"
                " attempts, time_created) VALUES (:s, 'exec_earlier', 'unknown', false, 10, 0)"
            ),
            {"s": sid},
        )
    assert (await sweep(h, temporal_env)).woken == (sid,)
    await h.until(lambda: _terminal(h, sid), timeout=30)
    failed = next(e for e in await h.events(sid) if e.type == "session.execution.failed")
    assert failed.data["error"] == {"type": "aborted", "message": BUDGET_MESSAGE, "status": None}
    assert len(h.requests()) == 1


async def _terminal(h: Harness, sid: str) -> bool:
    return "session.execution.failed" in await h.types(sid)


async def test_every_claimed_execution_starts_without_waiting_for_earlier_drains(
    h: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """Reference §7.4 #6: five abandoned sessions, one sweep: every recovered drain is running
    its turn at once (each waits on one gate that opens only when all five have asked), and
    the sweep itself waits for none of them."""
    recovered = h.gate_file("recovered")
    sessions: dict[str, str] = {}
    for i in range(5):
        name = f"model_{i}.json"
        model = h.script(
            [call("call_1", "gate", gate=h.gate_file("never"))],
            [{"wait_for_file": recovered}, {"text": "continued"}],
            name=name,
        )
        sid = await h.client.create_session(workspace=str(h.workspace), model=model)
        sessions[sid] = name
        await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 5, timeout=30)
    for sid in sessions:
        await h.client._handle(sid).terminate("simulated loss of the drain")
    await h.until(lambda: h.gate.active == 0, timeout=30)
    for sid in sessions:
        await expire_claim(h.store, sid)
    swept = await temporal_env.client.start_workflow(
        "RecoverySweep",
        SweepInput(),
        id=f"sweep-{uuid.uuid4()}",
        task_queue=h.client.task_queue,
        result_type=SweepResult,
    )
    # All five recovered turns have asked the model while the gate is still shut.
    await h.until(lambda: all(len(h.requests(n)) == 2 for n in sessions.values()), timeout=60)
    for sid in sessions:
        assert (await h.client.status(sid)).busy
    result = await asyncio.wait_for(swept.result(), 30)
    assert sorted(result.woken) == sorted(sessions)
    h.open_gate("recovered")
    for sid in sessions:
        await h.client.wait_idle(sid, timeout=30)
        types = await h.types(sid)
        assert types.count("session.execution.started") == 2
        assert types[-1] == "session.execution.succeeded"
        synthetic = [m.text for m in await h.messages(sid) if m.type == "synthetic"]
        assert synthetic == [RESTART_TEXT]


@pytest.fixture
async def long_lease(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> AsyncIterator[Harness]:
    """A lease no renewal comes near during a test (one every 200 s): a claim moved back in
    time and forward again is not renewed in between."""
    store = await open_test_store(lease_ms=600_000)
    async with harness(temporal_env.client, store, tmp_path) as running:
        yield running


async def test_the_sweep_leaves_a_session_that_is_draining_untouched(
    long_lease: Harness, temporal_env: WorkflowEnvironment
) -> None:
    """Reference §7.4 #10: the sweep leaves a session whose drain runs alone, its claim live
    or (a late renewal) already expired: no new run, no restart message, no resume counted,
    and the claim still the running execution's."""
    h = long_lease
    sid = await h.session([call("call_1", "gate", gate=h.gate_file("tool"))], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    run_id = (await h.client._handle(sid).describe()).run_id
    held = await h.store.claims.current(sid)
    assert held is not None and held.phase == "unknown"
    assert (await sweep(h, temporal_env)).woken == ()
    await expire_claim(h.store, sid)
    assert await _expired(h.store, sid)  # a candidate of the sweep
    result = await sweep(h, temporal_env)
    assert (result.woken, result.skipped) == ((), (sid,))
    async with h.store.db.write() as tx:  # the renewal the drain would have made
        await tx.conn.execute(
            sa.text(
                "UPDATE session_execution SET expires_at = expires_at + 3600000"
                " WHERE session_id = :sid"
            ),
            {"sid": sid},
        )
    claim = await h.store.claims.current(sid)
    assert claim is not None
    assert (claim.execution_id, claim.owner_id, claim.epoch) == (
        held.execution_id,
        held.owner_id,
        held.epoch,
    )
    assert await h.store.claims.recoveries(sid) == []
    assert (await h.client._handle(sid).describe()).run_id == run_id
    assert h.gate.active == 1 and "session.synthetic" not in await h.types(sid)
    h.open_gate("tool")
    await h.client.wait_idle(sid, timeout=30)
    types = await h.types(sid)
    assert types.count("session.execution.started") == 1
    assert types[-1] == "session.execution.succeeded"
    assert "session.synthetic" not in types and len(h.requests()) == 2


# --- worker processes ---------------------------------------------------------------------------


@pytest.mark.fault
async def test_a_paused_worker_whose_lease_expired_cannot_write_after_it_resumes(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """Catalogue F2: a paused owner. F9: its run ends without writing after the takeover."""
    async with harness(
        temporal_env.client, store, tmp_path, start_worker=False, breaks={UNSETTLED}
    ) as h:
        paused = WorkerProcess(
            temporal_env, target, h.client.task_queue, SESSIONFLOW_LEASE_MS="1500"
        )
        workers.append(paused)
        await paused.ready()
        sid = await h.session([{"text": "x" * 400, "chunks": 400, "delay_ms": 20}])
        await h.client.prompt(sid, "Go")
        await h.until(lambda: _deltas(h, sid, 20))
        async with outside_a_write(target):
            paused.signal(signal.SIGSTOP)
        await h.until(lambda: _expired_any(h.store, sid), timeout=30)
        stale = await h.store.claims.current(sid)
        assert stale is not None
        successor = await h.store.claims.acquire(sid, "exec_successor", "owner-successor")
        taken_at = await h.store.events.latest_sequence(sid)
        paused.signal(signal.SIGCONT)
        # The resumed worker streams on, and its next flush is refused: the busy period ends.
        await h.until(_idle(h, sid), timeout=30)
        late = [e for e in await h.events(sid) if e.seq > taken_at]
        assert late == [], [e.type for e in late]
        assert successor.epoch == stale.epoch + 1
        current = await h.store.claims.current(sid)
        assert current is not None and current.execution_id == "exec_successor"


def _idle(h: Harness, sid: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return not (await h.client.status(sid)).busy

    return check


async def _deltas(h: Harness, sid: str, count: int) -> bool:
    return (await h.types(sid, deltas=True)).count("session.text.delta") >= count


async def _expired_any(store: Store, sid: str) -> bool:
    return sid in await store.claims.expired()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _recorded(pids: list[int]) -> bool:
    from activities.tools.process import records_dir

    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    return any((records_dir() / str(group)).exists() for group in groups)


async def test_a_killed_workers_contained_tool_processes_die_with_it(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """Catalogue C1: SIGKILL mid-tool, in the sandbox: bubblewrap dies with the worker and the
    sandbox with it, or (a worker killed as the sandbox starts) the reap ends what is left
    (unconfined, the orphan is reaped by the next worker:
    ``test_killing_a_workers_process_group_mid_tool_leaves_an_orphan_...``)."""
    from activities.tools.process import reap_orphans

    marker = sleep_marker()
    async with harness(
        temporal_env.client, store, tmp_path, start_worker=False, breaks={UNSETTLED}
    ) as h:
        doomed = WorkerProcess(temporal_env, target, h.client.task_queue, SESSIONFLOW_SANDBOX="on")
        workers.append(doomed)
        await doomed.ready()
        sid = await h.session(
            [call("b1", "bash", command=f"sleep {marker}")],
            [{"text": "x"}],
            permissions=[{"tool": "bash", "action": "allow"}],
        )
        await h.client.prompt(sid, "Go")
        await h.until(lambda: bool(live_with(f"sleep {marker}")), timeout=30)
        # The worker records the group just after it starts: kill it once that is durable.
        await h.until(lambda: _recorded(live_with(f"sleep {marker}")), timeout=10)
        bubblewrap = [p for p in live_with(f"sleep {marker}") if _parent(p) == doomed.process.pid]
        assert len(bubblewrap) == 1
        doomed.signal(signal.SIGKILL)
        doomed.stop()
        # bubblewrap dies with the worker: it arms its parent-death signal before it lets the
        # sandbox start.
        await h.until(lambda: bubblewrap[0] not in live_with(f"sleep {marker}"), timeout=10)
        # The sandbox's PID 1 and the command die with bubblewrap, unless the worker died in
        # the moment before that PID 1 armed its own signal (seen 7 times in 400 kills here);
        # then a worker's reap ends them, found by the token in their environment.
        reap_orphans()
        await h.until(lambda: not live_with(f"sleep {marker}"), timeout=10)


async def test_a_retry_after_longer_than_the_lease_keeps_the_claim(short_lease: Harness) -> None:
    h = short_lease
    error = {"kind": "rate_limit", "message": "Slow down", "retry_after_ms": 3500}
    sid = await h.session([{"error": error}], [{"text": "after the wait"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 2, timeout=30)
    await h.client.wait_idle(sid, timeout=30)
    types = await h.types(sid)
    assert types[-1] == "session.execution.succeeded"
    assert "session.synthetic" not in types  # no takeover, no restart message


def _records(tmp_path: Path) -> Path:
    """A process-records root of the test's own (``SESSIONFLOW_PROCESS_DIR``): no other
    worker on the host reaps from it."""
    root = tmp_path / "processes"
    root.mkdir()
    return root


async def _tool_failures(h: Harness, sid: str) -> list[str]:
    """``type: message`` of every activity failure in the session's workflow history."""
    found = []
    async for event in h.client._handle(sid).fetch_history_events():
        if event.HasField("activity_task_failed_event_attributes"):
            failure = event.activity_task_failed_event_attributes.failure
            found.append(f"{failure.application_failure_info.type}: {failure.message}")
    return found


async def _append_as(store: Store, claim: Claim, text: str) -> None:
    async with store.claims.fenced(claim) as tx:
        await store.events.publish(ev.Synthetic(session_id=claim.session_id, text=text), tx=tx)


@pytest.mark.fault
async def test_a_paused_worker_stops_its_tool_processes_once_its_renewal_is_refused(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """Catalogue F2: a paused owner with a tool subprocess running. Worker A (lease 1.5 s) runs
    ``bash sleep``; it is SIGSTOPped until its claim expires by the database clock; B takes the
    claim over and appends; SIGCONT. A's next renewal is refused (``ClaimLostError``, in the
    run's history), which cancels the call and kills its process group; no write of A lands
    after the takeover, and B's appends before and after A resumed follow each other."""
    marker, records = sleep_marker(), _records(tmp_path)
    async with harness(
        temporal_env.client, store, tmp_path, start_worker=False, breaks={UNSETTLED}
    ) as h:
        paused = WorkerProcess(
            temporal_env,
            target,
            h.client.task_queue,
            SESSIONFLOW_LEASE_MS="1500",
            SESSIONFLOW_SANDBOX="off",
            SESSIONFLOW_PROCESS_DIR=str(records),
        )
        workers.append(paused)
        await paused.ready()
        sid = await h.session(
            [call("b1", "bash", command=f"sleep {marker}")],
            [{"text": "never asked"}],
            permissions=[{"tool": "bash", "action": "allow"}],
        )
        await h.client.prompt(sid, "Go")
        await h.until(lambda: recorded_in(records, live_with(f"sleep {marker}")), timeout=30)
        tool = live_with(f"sleep {marker}")
        async with outside_a_write(target):
            paused.signal(signal.SIGSTOP)
        await h.until(lambda: _expired_any(h.store, sid), timeout=30)
        stale = await h.store.claims.current(sid)
        assert stale is not None
        successor = await h.store.claims.acquire(sid, "exec_b", "owner-b", lease_ms=60_000)
        taken_at = await h.store.events.latest_sequence(sid)
        await _append_as(h.store, successor, "b before A resumed")
        assert live_with(f"sleep {marker}") == tool  # a paused worker kills nothing
        paused.signal(signal.SIGCONT)
        await h.until(lambda: not live_with(f"sleep {marker}"), timeout=30)
        await h.until(_idle(h, sid), timeout=30)
        await _append_as(h.store, successor, "b after A resumed")
        refusals = [f for f in await _tool_failures(h, sid) if f.startswith("ClaimLostError")]
        assert refusals and "taken over by execution exec_b" in refusals[0], refusals
        assert recorded_in(records, tool) == []  # untracked: killed by its own worker
        late = [e for e in await h.events(sid) if e.seq > taken_at]
        assert [(e.type, e.data["text"]) for e in late] == [
            ("session.synthetic", "b before A resumed"),
            ("session.synthetic", "b after A resumed"),
        ]
        assert [e.seq for e in late] == [taken_at + 1, taken_at + 2]
        assert successor.epoch == stale.epoch + 1
        with pytest.raises(ClaimLostError, match="taken over by execution exec_b"):
            await h.store.claims.renew(stale)  # what A's renewal met: no row to renew
        assert len(h.requests()) == 1


@pytest.mark.fault
async def test_killing_a_workers_process_group_mid_tool_leaves_an_orphan_the_next_worker_reaps(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """Catalogue C1: SIGKILL of the worker's whole process group while ``bash sleep`` runs.
    The command leads a session of its own, so the group kill misses it: an orphan. The next
    worker on the host kills it at start-up, before it polls (its reaper's record is gone once
    it reports ready); the call settles once, as outcome-unknown (not re-run), the model is
    asked again and the session succeeds."""
    marker, records = sleep_marker(), _records(tmp_path)
    env = {"SESSIONFLOW_SANDBOX": "off", "SESSIONFLOW_PROCESS_DIR": str(records)}
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        doomed = WorkerProcess(temporal_env, target, h.client.task_queue, own_group=True, **env)
        workers.append(doomed)
        await doomed.ready()
        sid = await h.session(
            [call("b1", "bash", command=f"sleep {marker}")],
            [{"text": "finished"}],
            permissions=[{"tool": "bash", "action": "allow"}],
        )
        await h.client.prompt(sid, "Go")
        await h.until(lambda: recorded_in(records, live_with(f"sleep {marker}")), timeout=30)
        orphan = live_with(f"sleep {marker}")
        doomed.signal_group(signal.SIGKILL)
        assert await doomed.exited() == -signal.SIGKILL
        assert live_with(f"sleep {marker}") == orphan  # it outlived its worker's group
        assert recorded_in(records, orphan)
        successor = WorkerProcess(temporal_env, target, h.client.task_queue, **env)
        workers.append(successor)
        await successor.ready()
        assert recorded_in(records, orphan) == []  # reaped before the worker polled
        await h.until(lambda: not live_with(f"sleep {marker}"), timeout=10)
        await h.client.wait_idle(sid, timeout=60)
    events = [e for e in await h.events(sid) if e.data.get("call_id") == "b1"]
    kinds = [e.type for e in events if not e.type.startswith("session.tool.input")]
    assert kinds == ["session.tool.called", "session.tool.failed"]
    assert events[-1].data["error"]["type"] == "tool.outcome-unknown"
    assert (await h.types(sid))[-1] == "session.execution.succeeded"
    assert len(h.requests()) == 2


# --- two real writers ---------------------------------------------------------------------------


class Link:
    """A TCP link from a worker process to the Temporal server that the test can hold: held,
    nothing crosses it either way. A worker resumed behind it meets the database before
    Temporal can tell it that its activity is gone (a heartbeat answered "not found" cancels
    the activity, and a cancelled one may stop before it writes)."""

    def __init__(self, upstream: str) -> None:
        self.host, port = upstream.rsplit(":", 1)
        self.port = int(port)
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> Link:
        self.server = await asyncio.start_server(self._connected, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for pump in self.pumps:
            pump.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            pump = asyncio.create_task(self._pump(source, sink))
            self.pumps.add(pump)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                await self.flowing.wait()
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()


def _refusals(log: str) -> list[str]:
    """The activity failures a worker process logged (its stderr): the first line of each, and
    the errors of its traceback."""
    text = Path(log).read_text() if Path(log).exists() else ""
    found = []
    for block in text.split("Completing activity as failed")[1:]:
        lines = block.splitlines()
        errors = [line for line in lines if line.split(":", 1)[0].endswith("Error")]
        found.append("\n".join([lines[0], *errors]))
    return found


async def _stored(h: Harness, sid: str) -> list[StoredEvent]:
    return [e async for e in h.store.events.log(sid) if isinstance(e, StoredEvent)]


@pytest.mark.fault
@pytest.mark.parametrize("takeover", ["sweep", "reset-last", "reset-first"])
async def test_a_paused_tool_worker_resuming_mid_turn_is_refused_by_the_drain_that_took_over(
    temporal_env: WorkflowEnvironment,
    open_test_store: StoreFactory,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
    takeover: str,
) -> None:
    """Catalogue F2 and F9 with two real writers. The session's tools run on host ``a``, whose
    only worker is process A (one activity slot: while its tool runs it has no poll open, so
    a stopped A swallows no task); B, the in-process worker, runs the workflow and the turns
    (lease 1.5 s). A runs the ``gate`` tool, writes its progress and is SIGSTOPped. Then
    another execution takes over:

    - ``sweep``: A's claim lapses by the database clock; the drain's run is terminated (as
      the tool's heartbeat timeout would end it, seconds later); the sweep's drain on B takes
      over (epoch + 1) and starts its turn;
    - ``reset-last`` / ``reset-first`` (issue 29, the operator's Reset, claim still live): a
      second tools-only worker A2 of host ``a`` is there to run the reset run's tool. Reset to
      the last workflow task replays the claim into the new run, which becomes its owner
      (same execution and epoch) and runs the call again on A2; reset to the first takes the
      claim over at once (epoch + 1: its owner's run is closed) and settles the old call.

    A resumes mid-turn (the successor's turn is held at its gate), within the heartbeat
    timeout (later, its own worker would cancel the timed-out call before it wrote anything)
    and with its link to Temporal held (else Temporal's "no such activity" could cancel it
    first): its tool returns and its settlement is refused, once, non-retryably
    (``ClaimLostError``, "taken over by" B's execution, or "owned by" the reset run). The
    successor's turn then ends; no event after the pause is the stale run's."""
    # The sweep needs the claim to lapse; a reset takes it live (a short lease would race
    # the reset run's reown against the stopped owner's expiry).
    lease_ms = 1500 if takeover == "sweep" else 60_000
    store = await open_test_store(lease_ms=lease_ms)
    log = str(tmp_path / "a.log")
    tools_worker = {
        "SESSIONFLOW_HOST": "a",
        "SESSIONFLOW_SERVE": "tools",
        "SESSIONFLOW_LEASE_MS": str(lease_ms),
        "SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES": "1",
    }
    async with (
        harness(temporal_env.client, store, tmp_path) as h,
        Link(temporal_env.client.service_client.config.target_host) as link,
    ):
        a = WorkerProcess(
            temporal_env, target, h.client.task_queue, address=link.address, log=log, **tools_worker
        )
        workers.append(a)
        await a.ready()
        sid = await h.session(
            [call("g1", "gate", text="from a", gate=h.gate_file("a"), progress="waiting on a")],
            [{"wait_for_file": h.gate_file("b")}, {"text": "answered on b"}],
            host="a",
        )
        await h.client.prompt(sid, "Go")
        stale_run = (await h.client._handle(sid).describe()).run_id
        assert stale_run is not None
        await h.until(lambda: _has(h, sid, "session.tool.progress"), timeout=30)
        before = await h.store.claims.current(sid)
        assert before is not None
        if takeover != "sweep":  # the host's second worker, polling while A's one slot is busy
            a2 = WorkerProcess(
                temporal_env,
                target,
                h.client.task_queue,
                log=str(tmp_path / "a2.log"),
                **tools_worker,
            )
            workers.append(a2)
            await a2.ready()
        async with outside_a_write(target):
            a.signal(signal.SIGSTOP)
        paused = asyncio.get_running_loop().time()
        paused_at = await h.store.events.latest_sequence(sid)
        if takeover == "sweep":
            await h.until(lambda: _expired_any(h.store, sid))
            # What the tool's heartbeat timeout does 5 s after the pause: the drain's run ends.
            await h.client._handle(sid).terminate("its tool's worker stopped answering")
            assert (await sweep(h, temporal_env)).woken == (sid,)
        else:
            await reset_workflow(h.client.temporal, h.client._handle(sid).id, to=takeover[6:])
            h.open_gate("a")  # for A2, running the call again (A, stopped, cannot see it)
        await h.until(lambda: len(h.requests()) == 2)  # B's turn streams, held at its gate
        # A resumes within its tool's heartbeat timeout: its worker still runs the call.
        assert TOOL.heartbeat is not None
        assert asyncio.get_running_loop().time() - paused < TOOL.heartbeat.total_seconds()
        taken = await h.store.claims.current(sid)
        assert taken is not None and _refusals(log) == []
        link.flowing.clear()
        h.open_gate("a")
        a.signal(signal.SIGCONT)
        await h.until(lambda: _refusals(log))
        link.flowing.set()
        h.open_gate("b")
        await h.client.wait_idle(sid, timeout=30)
        a.stop()
        events = await _stored(h, sid)
    # A wrote before the pause: its progress, under the stale execution.
    (stale, *again) = [e for e in events if isinstance(e.data, ev.ToolProgress)]
    assert isinstance(stale.data, ev.ToolProgress) and stale.epoch is not None
    assert stale.data.host == "a" and stale.seq <= paused_at
    assert (stale.execution_id, stale.epoch) == (before.execution_id, before.epoch)
    if takeover == "reset-last":  # the claim carried on, under its new owner
        assert (taken.execution_id, taken.epoch) == (before.execution_id, before.epoch)
        assert taken.owner_id != before.owner_id and stale_run in before.owner_id
        assert len(again) == 1 and again[0].seq > paused_at  # A2 ran the call again
    else:
        assert again == [] if takeover == "sweep" else all(e.seq > paused_at for e in again)
        assert taken.execution_id != stale.execution_id and taken.epoch == stale.epoch + 1
    late = [e for e in events if e.seq > paused_at]
    assert {(e.execution_id, e.epoch) for e in late} == {(taken.execution_id, taken.epoch)}
    kinds = [e.data.type for e in late if not e.data.type.endswith(".delta")]
    if takeover != "reset-last":
        assert kinds[0] == "session.execution.started"
    *_, turn = [i for i, kind in enumerate(kinds) if kind == "session.step.started"]
    assert kinds[turn:] == [
        "session.step.started",
        "session.text.started",
        "session.text.ended",
        "session.step.ended",
        "session.execution.succeeded",
    ]
    *_, answer = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert answer.time_completed is not None and answer.finish == "stop"
    assert "".join(getattr(part, "text", "") for part in answer.content) == "answered on b"
    (refusal,) = _refusals(log)  # A's one attempt, failed once
    assert "'activity_type': 'run_tool', 'attempt': 1" in refusal and stale_run in refusal
    lost = f"ClaimLostError: Claim on session {sid} lost by execution {stale.execution_id}: "
    if takeover == "reset-last":
        assert f"{lost}owned by {taken.owner_id}, not {before.owner_id}" in refusal, refusal
    else:
        assert f"{lost}taken over by execution {taken.execution_id}" in refusal, refusal


async def _has(h: Harness, sid: str, kind: str) -> bool:
    return any(e.data.type == kind for e in await _stored(h, sid))


async def test_a_tool_task_lost_between_its_poll_and_its_start_is_found_and_run_again(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """Catalogue C7, the task lost between poll and start: the only tools worker of host
    ``a`` (process A) reaches Temporal through a link the test holds while A's poll is open.
    The server hands A the session's ``run_tool`` task (the attempt is started, as the
    server sees it) and the answer stops in the link: A never starts it, and is then killed.
    The attempt's heartbeat timeout finds the lost task, Temporal runs attempt 2 on A2, a
    second worker of the host started after the kill, and the call settles once; nothing of
    the call was written before A2 ran it."""
    tools = {"SESSIONFLOW_HOST": "a", "SESSIONFLOW_SERVE": "tools"}
    async with (
        harness(temporal_env.client, store, tmp_path) as h,
        Link(temporal_env.client.service_client.config.target_host) as link,
    ):
        a = WorkerProcess(temporal_env, target, h.client.task_queue, address=link.address, **tools)
        workers.append(a)
        await a.ready()
        sid = await h.session(
            [call("g1", "gate", text="ran", progress="running")],
            [{"text": "after the lost task"}],
            host="a",
        )
        link.flowing.clear()  # A's open polls can take a task, whose answer never reaches A
        await h.client.prompt(sid, "Go")

        async def started_on_a() -> bool:
            pending = (await h.client._handle(sid).describe()).raw_description.pending_activities
            return any(
                p.activity_type.name == "run_tool" and p.attempt == 1 and p.last_worker_identity
                for p in pending
            )

        await h.until(started_on_a, timeout=30)
        a.stop()  # A dies with the task it never saw
        assert not await _has(h, sid, "session.tool.progress")
        a2 = WorkerProcess(temporal_env, target, h.client.task_queue, **tools)
        workers.append(a2)
        await a2.ready()
        await h.client.wait_idle(sid, timeout=60)
        link.flowing.set()
        events = await _stored(h, sid)
        history = [e async for e in h.client._handle(sid).fetch_history_events()]
    kinds = [e.data.type for e in events if getattr(e.data, "call_id", None) == "g1"]
    assert kinds.count("session.tool.called") == 1 and kinds.count("session.tool.progress") == 1
    assert kinds[-1] == "session.tool.success"
    assert [e.data.type for e in events][-1] == "session.execution.succeeded"
    runs = [
        e.activity_task_started_event_attributes.attempt
        for e in history
        if e.HasField("activity_task_started_event_attributes")
        and any(
            s.event_id == e.activity_task_started_event_attributes.scheduled_event_id
            and s.activity_task_scheduled_event_attributes.activity_type.name == "run_tool"
            for s in history
        )
    ]
    # Attempt 1 was lost; a later one ran it (the link keeps A's dead polls open on the
    # server's side, so attempt 2 may be handed to one of them and be lost too).
    assert len(runs) == 1 and runs[0] >= 2, runs
