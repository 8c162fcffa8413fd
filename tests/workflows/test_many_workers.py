"""Many workers: two worker processes on one store (a SQLite file or PostgreSQL) and one task
queue, and a reader following a session live in a third process (this one).

Concurrent sessions spread over both (the activities' started events name the worker that ran
them), and nothing is duplicated: every session ran its busy period once, each tool call
settled once, and every log keeps the invariants (``tests/invariants.py``, checked on the way
out of the harness). No activity failed, so no store error (SQLITE_BUSY included) reached one.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from sessionflow.models.drain import WORKFLOW_ID_PREFIX
from store import Store
from store.events import StoredEvent
from tests.conftest import Target
from tests.invariants import assert_clean, final_log
from tests.workflows.harness import call, follow_busy_period, harness
from tests.workflows.workers import WorkerProcess

SESSIONS = 12
TURNS = 2
TOOLS = 3


async def _identities(env: WorkflowEnvironment, sid: str) -> set[str]:
    """The workers that ran the session's activities, as the server recorded them."""
    handle = env.client.get_workflow_handle(f"{WORKFLOW_ID_PREFIX}{sid}")
    found: set[str] = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            found.add(event.activity_task_started_event_attributes.identity)
    return found


async def test_two_worker_processes_share_the_sessions_and_duplicate_nothing(
    temporal_env: WorkflowEnvironment,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """S11 (on SQLite) and issue 14's many workers: two worker processes drain 12 sessions on
    one store while this process follows one of them live. Both ran activities; no activity
    task failed in any history (no SQLITE_BUSY or other store error reached one); each busy
    period ran once, each
    call settled once; the follower got exactly the final log; SQLite's WAL stayed under
    64 MB."""
    store: Store = await target.open()
    try:
        async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
            for _ in range(2):
                workers.append(WorkerProcess(temporal_env, target, h.client.task_queue))
            await asyncio.gather(*(worker.ready() for worker in workers))
            turns = [
                [call(f"t{t}c{i}", text=f"{t}/{i}") for i in range(TOOLS)] for t in range(TURNS)
            ]
            sids = [await h.session(*turns, [{"text": "Done."}]) for _ in range(SESSIONS)]
            followed: list[StoredEvent] = []
            reader = asyncio.create_task(follow_busy_period(store, sids[0], followed))
            await asyncio.gather(*(h.client.prompt(sid, "Go") for sid in sids))
            await asyncio.gather(*(h.client.wait_idle(sid, timeout=120) for sid in sids))
            await asyncio.wait_for(reader, 30)
            assert [e.id for e in followed] == [e.id for e in await final_log(store, sids[0])]
            identities: Counter[str] = Counter()
            for sid in sids:
                assert await _failed_activities(temporal_env, sid) == []
                log = await final_log(store, sid)
                assert_clean(log)
                types = Counter(e.data.type for e in log)
                assert types["session.execution.started"] == 1
                assert types["session.execution.succeeded"] == 1
                assert types["session.tool.called"] == TURNS * TOOLS
                assert types["session.tool.success"] == TURNS * TOOLS
                assert len({e.id for e in log}) == len(log)
                identities.update(await _identities(temporal_env, sid))
        pids = {str(worker.process.pid) for worker in workers}
        # An identity is ``host/pid store:<key>`` (worker.py).
        ran = {pid for pid in pids if any(i.split()[0].endswith(f"/{pid}") for i in identities)}
        assert ran == pids, (pids, identities)
        if target.backend == "sqlite":
            wal = Path(str(store.db.url).removeprefix("sqlite+aiosqlite:///") + "-wal")
            assert wal.stat().st_size < 64 * 2**20
    finally:
        await store.close()


async def _failed_activities(env: WorkflowEnvironment, sid: str) -> list[str]:
    """Every activity failure or timeout in the session's workflow history."""
    failed = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    }
    handle = env.client.get_workflow_handle(f"{WORKFLOW_ID_PREFIX}{sid}")
    return [
        str(event.activity_task_failed_event_attributes.failure.message)
        async for event in handle.fetch_history_events()
        if event.event_type in failed
    ]
