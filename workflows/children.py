"""Child sessions, as the parent's workflow sees them (DESIGN "Children, hosts, spend, rewind").

A ``task`` call's ``run_tool`` creates the child session, admits its prompt and starts the
child's own ``SessionWorkflow`` (signal-with-start, as a client does: its summary names the
parent and the task), then returns "child"; the parent's workflow waits here on a workflow
condition, as ``approvals.py`` waits for a person: no activity, no heartbeat, no
``max_active_tools`` slot, nothing a restarted worker could lose. The child's busy period ends
with the ``child_finished`` signal, a hint: the call then runs again and settles with what the
store says the child answered. A wait past the call's ``timeout_s`` interrupts the child and
fails only its own call. Interrupting the parent interrupts every child it waits on and its
background tasks, and waits (a bounded while) for those it waits on to settle, so nothing of
the tree runs on after the parent's step settled. Pure workflow code: no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from sessionflow.models.drain import (
        ChildFinished,
        ChildWait,
        InterruptRequest,
        workflow_id,
    )

# How long an interrupted parent waits for its children to settle before it settles itself.
SETTLE_CHILDREN = timedelta(seconds=60)


class Children:
    def __init__(self) -> None:
        # Children this run's calls wait on, and its background tasks still running.
        self.active: dict[str, ChildWait] = {}
        self.background: dict[str, ChildWait] = {}
        self.finished: dict[str, ChildFinished] = {}
        # The step's ``task`` calls in flight, for the fan-out bound.
        self.calls: set[tuple[str, str]] = set()

    def waiting(self) -> tuple[ChildWait, ...]:
        return tuple(self.active.values())

    def take(self, finished: ChildFinished) -> None:
        """The ``child_finished`` signal, kept for whichever call of the child waits now or
        soon (it may come before the call's ``run_tool`` answered). Only a hint: the call's
        settlement reads from the store whether its own prompt was answered, and waits on
        when it was not."""
        self.finished[finished.child_session_id] = finished
        self.background.pop(finished.child_session_id, None)

    async def run(self, wait: ChildWait, stopping: Callable[[], bool]) -> ChildFinished:
        """Wait for the child ``run_tool`` started: its outcome once it ended (or timed
        out). Cancelled once ``stopping`` holds."""
        cid = wait.session_id
        self.active[cid] = wait
        timeout = timedelta(seconds=wait.timeout_s) if wait.timeout_s else None
        try:
            await workflow.wait_condition(
                lambda: cid in self.finished or stopping(), timeout=timeout
            )
        except TimeoutError:
            self.active.pop(cid, None)
            await _interrupt(cid, "timeout")
            return ChildFinished(child_session_id=cid, outcome="interrupted", timed_out=True)
        if cid not in self.finished:
            raise asyncio.CancelledError()
        self.active.pop(cid, None)
        return self.finished.pop(cid)

    async def stop_all(self, reason: str) -> None:
        """The parent is interrupted: interrupt every child, then wait (bounded) until those
        it waits on have settled."""
        everyone = [*self.active, *self.background]
        await asyncio.gather(*(_interrupt(cid, reason) for cid in everyone))
        waited = list(self.active)
        try:
            await workflow.wait_condition(
                lambda: all(cid in self.finished for cid in waited), timeout=SETTLE_CHILDREN
            )
        except TimeoutError:
            workflow.logger.warning("Children still running after the interrupt: %s", waited)
        self.active.clear()
        self.background.clear()
        self.finished.clear()
        self.calls.clear()


async def _interrupt(child_id: str, reason: str) -> None:
    try:
        await workflow.get_external_workflow_handle(workflow_id(child_id)).signal(
            "interrupt", InterruptRequest(reason=reason)
        )
    except Exception as error:  # its drain is gone: nothing runs there to interrupt
        workflow.logger.info("Interrupt of child %s not delivered: %s", child_id, error)
