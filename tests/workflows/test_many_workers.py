"""Many workers: two worker processes on one PostgreSQL store and one task queue.

Concurrent sessions spread over both (the activities' started events name the worker that ran
them), and nothing is duplicated: every session ran its busy period once, each tool call
settled once, and every log keeps the invariants (``tests/invariants.py``, checked on the way
out of the harness).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from sessionflow.models.drain import WORKFLOW_ID_PREFIX
from store import Store
from tests.conftest import Target
from tests.invariants import assert_clean, final_log
from tests.workflows.harness import call, harness
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
    postgres_target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    store: Store = await postgres_target.open()
    try:
        async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
            for _ in range(2):
                workers.append(WorkerProcess(temporal_env, postgres_target, h.client.task_queue))
            await asyncio.gather(*(worker.ready() for worker in workers))
            turns = [
                [call(f"t{t}c{i}", text=f"{t}/{i}") for i in range(TOOLS)] for t in range(TURNS)
            ]
            sids = [await h.session(*turns, [{"text": "Done."}]) for _ in range(SESSIONS)]
            await asyncio.gather(*(h.client.prompt(sid, "Go") for sid in sids))
            await asyncio.gather(*(h.client.wait_idle(sid, timeout=120) for sid in sids))
            identities: Counter[str] = Counter()
            for sid in sids:
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
        ran = {pid for pid in pids if any(i.endswith(f"/{pid}") for i in identities)}
        assert ran == pids, (pids, identities)
    finally:
        await store.close()
