"""The recovery sweep's activity: wake sessions whose drain died mid-turn.

A session whose claim expired in phase ``unknown`` (a model call or tool was in flight) or
``continue`` (the step needed another turn), and that has no open drain, was abandoned: its
worker died and Temporal will not bring the run back (it was terminated, or timed out). Waking it
starts a drain that takes the claim over, which records the recovery the drain then performs.

A live claim in those phases whose session has no running workflow was abandoned too, only
more recently: an operator terminated the run, or it timed out. Temporal knows at once, so the
sweep does not wait for the lease: the drain it starts takes over at once (``closed_owner`` in
``activities/session.py``). Which sessions run is one visibility query per sweep, not a call
per claim; each candidate is confirmed by describing its workflow (visibility lags).

The sweep also prunes the file-change journal's content past its retention
(``store/blobs.py``), at most every ten minutes per worker.
"""

from __future__ import annotations

import logging
import time

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from activities.runtime import Runtime
from sessionflow.models.drain import (
    SESSION_ID_SEARCH_ATTRIBUTE,
    DrainInput,
    SweepInput,
    SweepResult,
    WakeSignal,
    workflow_id,
)
from store.claims import Phase

_SESSION_ID = SearchAttributeKey.for_keyword(SESSION_ID_SEARCH_ATTRIBUTE)
PRUNE_EVERY_S = 600.0
log = logging.getLogger(__name__)


class SweepActivities:
    def __init__(self, runtime: Runtime, *, task_queue: str) -> None:
        self.rt = runtime
        self.task_queue = task_queue
        self.pruned_at: float | None = None

    @activity.defn
    async def sweep_recoverable(self, request: SweepInput) -> SweepResult:
        client = activity.client()
        phases: tuple[Phase, ...] = ("unknown", "continue")
        candidates = await self.rt.store.claims.expired(limit=request.limit, phases=phases)
        live = await self.rt.store.claims.live(limit=10 * request.limit, phases=phases)
        if live:
            running = await self._running()
            unowned = [sid for sid in live if workflow_id(sid) not in running]
            candidates += unowned[: max(0, request.limit - len(candidates))]
        woken: list[str] = []
        skipped: list[str] = []
        for session_id in candidates:
            if await self._drain_open(session_id):
                skipped.append(session_id)
                continue
            await client.start_workflow(
                "SessionWorkflow",
                DrainInput(session_id=session_id),
                id=workflow_id(session_id),
                task_queue=self.task_queue,
                start_signal="wake",
                start_signal_args=[WakeSignal()],
                # Like every run the client starts: a recovered drain is found by its session.
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(_SESSION_ID, session_id)]
                ),
                static_summary=f"session {session_id} (recovered)",
            )
            woken.append(session_id)
            activity.heartbeat(len(woken))
        await self._prune()
        return SweepResult(woken=tuple(woken), skipped=tuple(skipped))

    async def _prune(self) -> None:
        """The journal's content past its retention, at most every ``PRUNE_EVERY_S`` per
        worker (the sweep passes every few seconds; the retention is days)."""
        now = time.monotonic()
        if self.pruned_at is not None and now - self.pruned_at < PRUNE_EVERY_S:
            return
        self.pruned_at = now
        pruned = await self.rt.store.blobs.prune(self.rt.retention)
        if pruned.blobs:
            log.info("pruned %d journal contents (%d bytes)", pruned.blobs, pruned.bytes)

    async def _running(self) -> set[str]:
        """The workflow ids of this deployment's running session workflows, as visibility says."""
        query = (
            f"WorkflowType = 'SessionWorkflow' AND ExecutionStatus = 'Running' "
            f"AND TaskQueue = '{self.task_queue}'"
        )
        running = set()
        async for execution in activity.client().list_workflows(query, page_size=1000):
            running.add(execution.id)
        return running

    async def _drain_open(self, session_id: str) -> bool:
        try:
            description = (
                await activity.client().get_workflow_handle(workflow_id(session_id)).describe()
            )
        except RPCError:
            return False
        return description.status == WorkflowExecutionStatus.RUNNING
