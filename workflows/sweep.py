"""The recovery sweep, run by a Temporal Schedule (every 30 s by default)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from sessionflow.models.drain import SweepInput, SweepResult


@workflow.defn
class RecoverySweep:
    @workflow.run
    async def run(self, request: SweepInput) -> SweepResult:
        woken: list[str] = []
        skipped: tuple[str, ...] = ()
        for round in range(request.rounds):
            if round:
                await workflow.sleep(timedelta(seconds=request.every_s))
            result: SweepResult = await workflow.execute_activity(
                "sweep_recoverable",
                request,
                result_type=SweepResult,
                start_to_close_timeout=timedelta(minutes=2),
                schedule_to_close_timeout=timedelta(minutes=10),  # three attempts (C7)
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
                summary=f"wake up to {request.limit} abandoned sessions",
            )
            woken += result.woken
            skipped = result.skipped
        return SweepResult(woken=tuple(woken), skipped=skipped)
