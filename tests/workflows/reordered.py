"""A negative control for replay tests, in a module with nothing else to import.

The sandbox re-imports the module that defines a workflow: this one imports only the real
workflow, so replaying it stays as cheap and as restricted as the real one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from sessionflow.models.drain import DrainInput, SweepInput, SweepResult
    from workflows.session import SessionWorkflow
    from workflows.sweep import RecoverySweep


@workflow.defn(name="SessionWorkflow")
class ReorderedSessionWorkflow(SessionWorkflow):
    """Checks inputs before claiming, which changes the order of commands."""

    @workflow.run
    async def run(self, input: DrainInput) -> None:
        await super().run(input)

    async def _acquire(self, period: int, force: bool) -> Any:
        await workflow.execute_activity(
            "pending_inputs", None, start_to_close_timeout=timedelta(seconds=5)
        )
        return await super()._acquire(period, force)


@workflow.defn(name="RecoverySweep")
class ReorderedRecoverySweep(RecoverySweep):
    """Waits before its first round, which changes the order of commands."""

    @workflow.run
    async def run(self, request: SweepInput) -> SweepResult:
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(request)
