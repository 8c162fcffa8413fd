"""Hosts: a session's tools run on the workers of its host, and a vanished host never hangs it.

Worker processes with their own ``SESSIONFLOW_HOST`` and workspace roots share one task queue
for turns; each serves its host's tools on ``<task queue>@<host>``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.cli import _status_text
from sessionflow.errors import HostUnavailableError, SessionBusyError, UnknownHostError
from sessionflow.models import events as ev
from sessionflow.models.drain import tool_queue
from store.events import StoredEvent
from tests.conftest import Target
from tests.workflows.harness import Harness, call, harness
from tests.workflows.tools import registry
from tests.workflows.workers import WorkerProcess
from worker import SessionWorker, build_worker

pytestmark = pytest.mark.fault  # worker processes killed and started: the slow fault tests

LEASE_MS = "3000"  # a host's lease in these tests: a gone host is noticed within seconds


# The worker's own record of what it ran: the environment of the process that ran the command.
WHO_RAN = "tr '\\0' '\\n' < /proc/$PPID/environ | grep ^SESSIONFLOW_HOST="


ALLOW_BASH = [{"tool": "bash", "action": "allow"}]


def _bash(call_id: str, command: str = WHO_RAN) -> dict[str, Any]:
    return call(call_id, "bash", command=command, description="where")


async def _host_worker(
    env: WorkflowEnvironment, target: Target, h: Harness, workers: list[WorkerProcess], host: str
) -> WorkerProcess:
    worker = WorkerProcess(
        env,
        target,
        h.client.task_queue,
        SESSIONFLOW_HOST=host,
        SESSIONFLOW_SANDBOX="off",  # bash sees the worker's own environment: its record
        SESSIONFLOW_HOST_LEASE_MS=LEASE_MS,
    )
    workers.append(worker)
    await worker.ready()
    return worker


async def _settled(h: Harness, sid: str) -> list[ev.ToolSucceeded | ev.ToolFailed]:
    stored = [e async for e in h.store.events.log(sid) if isinstance(e, StoredEvent)]
    return [e.data for e in stored if isinstance(e.data, ev.ToolSucceeded | ev.ToolFailed)]


@pytest.fixture
async def hosted(
    temporal_env: WorkflowEnvironment, store: Any, tmp_path: Path
) -> Any:  # a harness whose only workers are the test's processes
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        yield h


async def test_each_host_runs_only_its_own_sessions_tools(
    temporal_env: WorkflowEnvironment,
    target: Target,
    hosted: Harness,
    workers: list[WorkerProcess],
) -> None:
    h = hosted
    for host in ("a", "b"):
        await _host_worker(temporal_env, target, h, workers, host)
    sessions = {}
    for host in ("a", "b"):
        workspace = h.root / f"root-{host}"
        workspace.mkdir()
        model = h.script([_bash("c1"), _bash("c2")], [{"text": "done"}], name=f"{host}.json")
        sessions[host] = await h.client.create_session(
            workspace=str(workspace), model=model, host=host, permissions=ALLOW_BASH
        )
    for sid in sessions.values():
        await h.client.prompt(sid, "Where do you run?")
    for host, sid in sessions.items():
        await h.client.wait_idle(sid, timeout=60)
        settled = await _settled(h, sid)
        assert [e.type for e in settled] == ["session.tool.success"] * 2
        assert {e.host for e in settled} == {host}  # the events say which host ran it
        # ... and so does the worker itself: bash ran in its environment.
        assert {e.output or e.content[0].text for e in settled} == {f"SESSIONFLOW_HOST={host}\n"}  # type: ignore[union-attr]
        assert (await h.client.session(sid)).host == host
    hosts = {w.host: w for w in await h.client.hosts()}
    assert set(hosts) >= {"a", "b"} and "bash" in hosts["a"].tools


async def test_a_session_for_a_host_that_never_registered_is_refused(h: Harness) -> None:
    with pytest.raises(UnknownHostError, match="host `ci-3` has never registered"):
        await h.session([{"text": "hi"}], host="ci-3")
    assert await h.client.list_sessions() == []


async def test_a_vanished_host_fails_its_calls_and_a_returning_one_runs_them(
    temporal_env: WorkflowEnvironment,
    target: Target,
    hosted: Harness,
    workers: list[WorkerProcess],
) -> None:
    h = hosted
    await _host_worker(temporal_env, target, h, workers, "turns")  # runs the turns throughout
    b = await _host_worker(temporal_env, target, h, workers, "b")
    gate = h.gate_file("g")
    model = h.script(
        # Killed mid-call, re-run when b is back:
        [call("g1", "gate", text="ran", gate=gate, progress="on b")],
        [{"text": "first done"}],
        [call("e1", "echo", text="x")],  # b is gone: the host error
        [call("e2", "echo", text="y")],  # still gone: at once
        [{"text": "second done"}],
        [call("e3", "echo", text="z")],  # b is back
        [{"text": "third done"}],
    )
    workspace = h.root / "root-b"
    workspace.mkdir()
    sid = await h.client.create_session(workspace=str(workspace), model=model, host="b")
    await h.client.prompt(sid, "one")
    await h.until(lambda: _progress(h, sid, "g1"), timeout=30)
    b.signal(signal.SIGKILL)
    b = await _host_worker(temporal_env, target, h, workers, "b")  # back within the lease
    h.open_gate("g")
    await h.client.wait_idle(sid, timeout=60)
    (ran,) = await _settled(h, sid)
    assert (ran.type, ran.host) == ("session.tool.success", "b")

    b.signal(signal.SIGKILL)
    with pytest.raises(HostUnavailableError):  # a gone host cannot check a workspace
        await h.client.move(sid, "b")
    await h.client.prompt(sid, "two")
    await h.client.wait_idle(sid, timeout=60)
    failed = (await _settled(h, sid))[1:]
    assert [(e.type, e.call_id) for e in failed] == [
        ("session.tool.failed", "e1"),
        ("session.tool.failed", "e2"),
    ]
    for event in failed:
        assert isinstance(event, ev.ToolFailed)
        assert event.error.message == "host `b` is not running; the tool did not run"
    assert (await h.client.status(sid)).busy is False

    await _host_worker(temporal_env, target, h, workers, "b")
    await h.client.prompt(sid, "three")
    await h.client.wait_idle(sid, timeout=60)
    last = (await _settled(h, sid))[-1]
    assert (last.type, last.call_id, last.host) == ("session.tool.success", "e3", "b")


async def _progress(h: Harness, sid: str, call_id: str) -> bool:
    """The call runs on its host: it reported progress."""
    stored = [e async for e in h.store.events.log(sid) if isinstance(e, StoredEvent)]
    return any(isinstance(e.data, ev.ToolProgress) and e.data.call_id == call_id for e in stored)


async def test_a_session_moves_between_busy_periods_and_keeps_its_host(
    temporal_env: WorkflowEnvironment,
    target: Target,
    hosted: Harness,
    workers: list[WorkerProcess],
) -> None:
    h = hosted
    for host in ("a", "b"):
        await _host_worker(temporal_env, target, h, workers, host)
        (h.root / f"root-{host}").mkdir()
    (h.root / "root-b" / "AGENTS.md").write_text("Work on b.")
    gate = h.gate_file("busy")
    model = h.script(
        [call("g1", "gate", text="a", gate=gate, progress="on a")],
        [{"text": "on a"}],
        [_bash("c2")],
        [{"text": "on b"}],
    )
    sid = await h.client.create_session(
        workspace=str(h.root / "root-a"), model=model, host="a", permissions=ALLOW_BASH
    )
    await h.client.prompt(sid, "one")
    await h.until(lambda: _progress(h, sid, "g1"), timeout=30)
    with pytest.raises(SessionBusyError):
        await h.client.move(sid, "b", workspace=str(h.root / "root-b"))
    h.open_gate("busy")
    await h.client.wait_idle(sid, timeout=60)
    moved = await h.client.move(sid, "b", workspace=str(h.root / "root-b"))
    assert (moved.host, moved.directory) == ("b", str(h.root / "root-b"))
    # A full restart of every worker: the placement is the session's, in the store.
    for worker in list(workers):
        worker.stop()
    for host in ("a", "b"):
        await _host_worker(temporal_env, target, h, workers, host)
    await h.client.prompt(sid, "two")
    await h.client.wait_idle(sid, timeout=60)
    last = (await _settled(h, sid))[-1]
    assert (last.call_id, last.host) == ("c2", "b")
    # The new workspace's instruction file, as host b read it, is the new baseline.
    first, *_, last_request = h.requests()
    assert "Work on b." not in str(first["system"])
    assert "Work on b." in str(last_request["system"])


def host_worker(h: Harness, host: str) -> SessionWorker:
    """An in-process worker serving only ``host``'s tools (the harness's runs the turns)."""
    tools = registry(h.gate)
    return build_worker(
        h.client.temporal,
        h.store,
        task_queue=h.client.task_queue,
        tools=tools,
        host=host,
        serve="tools",
    )


async def restarting(h: Harness, host: str) -> None:
    """``host`` as it is while its worker restarts: a live lease, and nothing polls its queue."""
    queue = tool_queue(h.client.task_queue, host)
    await h.store.hosts.renew(host, f"{host}-restarting", task_queue=queue, version="test")


async def _waiting_for(h: Harness, sid: str) -> tuple[str, ...]:
    drain = (await h.client.status(sid)).drain
    return drain.waiting_hosts if drain else ()


async def test_a_call_for_a_restarting_host_waits_and_says_so(h: Harness) -> None:
    async with host_worker(h, "b"):
        sid = await h.session([call("c1", text="ran")], [{"text": "done"}], host="b")
    await restarting(h, "b")
    await h.client.prompt(sid, "go")
    await h.until(lambda: _waiting_for(h, sid), timeout=30)
    assert await _waiting_for(h, sid) == ("b",)
    assert "waiting for host b" in _status_text(await h.client.status(sid))
    metadata = await h.client._handle(sid).query("__temporal_workflow_metadata")
    assert "waiting for host b" in metadata.current_details  # the Temporal UI's details
    async with host_worker(h, "b"):  # back within its lease: the call runs, once
        await h.client.wait_idle(sid, timeout=30)
    (ran,) = await _settled(h, sid)
    assert (ran.type, ran.call_id, ran.host) == ("session.tool.success", "c1", "b")
    metadata = await h.client._handle(sid).query("__temporal_workflow_metadata")
    assert "waiting for host" not in metadata.current_details
