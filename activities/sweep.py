"""The recovery sweep's activity: wake sessions whose drain died mid-turn.

A session whose claim expired in phase ``unknown`` (a model call or tool was in flight) or
``continue`` (the step needed another turn), and that has no open drain, was abandoned: its
worker died and Temporal will not bring the run back (it was terminated, or timed out). Waking it
starts a drain that takes the claim over, which records the recovery the drain then performs.
"""

from __future__ import annotations

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

_SESSION_ID = SearchAttributeKey.for_keyword(SESSION_ID_SEARCH_ATTRIBUTE)


class SweepActivities:
    def __init__(self, runtime: Runtime, *, task_queue: str) -> None:
        self.rt = runtime
        self.task_queue = task_queue

    @activity.defn
    async def sweep_recoverable(self, request: SweepInput) -> SweepResult:
        client = activity.client()
        candidates = await self.rt.store.claims.expired(
            limit=request.limit, phases=("unknown", "continue")
        )
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
        return SweepResult(woken=tuple(woken), skipped=tuple(skipped))

    async def _drain_open(self, session_id: str) -> bool:
        try:
            description = (
                await activity.client().get_workflow_handle(workflow_id(session_id)).describe()
            )
        except RPCError:
            return False
        return description.status == WorkflowExecutionStatus.RUNNING
