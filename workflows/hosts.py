"""Tool calls on a named host's queue, as the session workflow runs them; and the workspace
check a client asks a host for (DESIGN "Children, hosts, spend, rewind").

A call for host H runs on ``<task queue>@H``, waiting ``BOUND`` for one of H's workers to pick
it up (a live host takes a call within milliseconds). When none does, the host's leases decide:
a live host (busy, or restarting within its lease) gets the call again, its attempts counted on
(the tool-attempt fence), and the call shows as waiting for H (status, the page, the Temporal
UI) until the newest lease would have run out, plus ``BOUND``; a host with no live lease has the
call settled from the shared queue ("host `H` is not running; the tool did not run", or
outcome-unknown when one of its workers took the call), and every later call for it checks its
leases first, so it fails at once while H stays down. A call for a host whose last worker died
therefore fails within ``BOUND`` + the lease + ``BOUND``. Pure workflow code: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import cast

from temporalio import workflow
from temporalio.exceptions import ActivityError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

from workflows.options import SHORT, Options, call

with workflow.unsafe.imports_passed_through():
    from sessionflow.models.drain import (
        LOCAL_HOST,
        HostStateInput,
        HostStateResult,
        ToolInput,
        ToolOutcome,
        UnreachableInput,
        WorkspaceCheckInput,
        WorkspaceCheckResult,
        tool_queue,
    )

# How much longer than its lease a host may take to pick a call up.
BOUND = timedelta(seconds=5)
# Above every attempt a host's workers can have made: the settlement from the shared queue.
_SETTLING_ATTEMPT = 1000


class HostCalls:
    def __init__(self, changed: Callable[[], None] = lambda: None) -> None:
        self.down: set[str] = set()
        self.waiting: dict[str, str] = {}  # call id -> host it waits for
        self.lease_ms = 30_000  # the hosts' lease, from the busy period's preparation
        self._changed = changed  # what is waiting changed: the drain shows it

    def waiting_hosts(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.waiting.values())))

    async def run(self, host: str, request: ToolInput, options: Options) -> ToolOutcome:
        """Run ``request`` on ``host``'s queue, as the module docstring says."""
        assert host != LOCAL_HOST
        queue, wait = tool_queue(workflow.info().task_queue, host), BOUND
        base = request.attempt_base
        try:
            while True:
                if host in self.down and (await self._state(host)).status == "gone":
                    return await self._unreachable(host, request)
                self.down.discard(host)
                attempt = request.model_copy(update={"attempt_base": base})
                on_host = replace(options, task_queue=queue, schedule_to_start=wait)
                try:
                    summary = f"{request.name} {request.call_id} on {host}"
                    return await call("run_tool", attempt, ToolOutcome, summary, on_host)
                except ActivityError as error:
                    if not _not_picked_up(error):
                        raise
                base += on_host.retry.maximum_attempts or 3
                state = await self._state(host)
                if state.status == "gone":
                    self.down.add(host)
                    return await self._unreachable(host, request)
                # Live, but nobody took it (restarting, or every slot busy): it waits on, until
                # the newest lease would have run out unrenewed.
                left = max(0, self.lease_ms - (state.seen_ms_ago or 0))
                wait = timedelta(milliseconds=left) + BOUND
                if self.waiting.get(request.call_id) != host:
                    self.waiting[request.call_id] = host
                    self._changed()
        finally:
            if self.waiting.pop(request.call_id, None) is not None:
                self._changed()

    async def _state(self, host: str) -> HostStateResult:
        ask = HostStateInput(host=host)
        return await call("host_state", ask, HostStateResult, f"host {host}", SHORT)

    async def _unreachable(self, host: str, request: ToolInput) -> ToolOutcome:
        settle = UnreachableInput(
            tool=request, host=host, attempt=request.attempt_base + _SETTLING_ATTEMPT
        )
        summary = f"{request.name} {request.call_id}: host {host} is not running"
        return await call("host_unreachable", settle, ToolOutcome, summary, SHORT)


def _not_picked_up(error: ActivityError) -> bool:
    cause = error.cause
    return isinstance(cause, ActivityTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


@workflow.defn
class WorkspaceCheck:
    """Run on a host's queue by a client placing a session there: the host checks the
    workspace where it lives (and reads its instruction files)."""

    @workflow.run
    async def run(self, request: WorkspaceCheckInput) -> WorkspaceCheckResult:
        result = await workflow.execute_local_activity(
            "check_workspace",
            request,
            result_type=WorkspaceCheckResult,
            start_to_close_timeout=timedelta(seconds=10),
        )
        return cast(WorkspaceCheckResult, result)
