"""Calls waiting for a person, as the session workflow sees them (DESIGN "Permissions and
questions").

A call whose ``run_tool`` returned "needs approval" waits here on a workflow condition: no
activity, no heartbeat, no ``max_active_tools`` slot, nothing a restarted worker could lose
(the wait is rebuilt by replay). The ``respond`` update (update id = request id, so a repeat is
answered once) or signal (sent when no worker answered in time) delivers the reply. The state
only mirrors what the replies carry; ``run_tool`` records them as events when the call goes on.
Pure workflow code: no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from sessionflow.models.permissions import PermissionReply, PermissionRequest


class Approvals:
    def __init__(self) -> None:
        self.pending: dict[str, PermissionRequest] = {}
        self.replies: dict[str, PermissionReply] = {}
        # Rejections that stopped the step, recorded with its settlement.
        self.declined: list[PermissionReply] = []

    def waiting(self) -> tuple[PermissionRequest, ...]:
        return tuple(self.pending.values())

    def validate(self, reply: PermissionReply) -> None:
        """The ``respond`` update's validator: an unknown or settled request changes nothing."""
        request = self.pending.get(reply.request_id)
        if request is None or reply.request_id in self.replies:
            raise ValueError(
                f"No request {reply.request_id} is waiting for an answer: it is unknown, or "
                "already answered"
            )
        if request.kind == "question" and reply.decision != "reject" and reply.answer is None:
            raise ValueError("A question needs an answer (or reject, to cancel it)")
        if request.kind == "permission" and reply.answer is not None:
            raise ValueError("A permission ask is approved or denied, not answered")

    def take(self, reply: PermissionReply, *, early: bool = False) -> bool:
        """Keep the first reply to a waiting request. ``early`` (the signal) keeps one for a
        request not waiting yet: its ``run_tool`` recorded the ask and then lost its worker,
        and a retry asks again."""
        if reply.request_id in self.replies:
            return False
        if reply.request_id not in self.pending and not early:
            return False
        self.replies[reply.request_id] = reply
        return True

    async def wait(
        self, request: PermissionRequest, stopping: Callable[[], bool]
    ) -> PermissionReply:
        """The reply to ``request``; a rejection saying so once ``timeout_s`` ran out.
        Cancelled once ``stopping`` holds: an interrupt whose cancellation an activity that
        had just finished swallowed still ends the wait."""
        rid = request.request_id
        self.pending[rid] = request
        try:
            timeout = timedelta(seconds=request.timeout_s) if request.timeout_s else None
            try:
                await workflow.wait_condition(
                    lambda: rid in self.replies or stopping(), timeout=timeout
                )
                if rid not in self.replies:
                    raise asyncio.CancelledError()
            except TimeoutError:
                self.replies[rid] = PermissionReply(
                    request_id=rid,
                    decision="reject",
                    message=f"No answer within {request.timeout_s:g} s: the call did not run.",
                    timed_out=True,
                )
            return self.replies.pop(rid)
        finally:
            self.pending.pop(rid, None)

    def settle_all(self) -> None:
        """The step stopped: forget what waited (its settlement records their replies)."""
        self.pending.clear()
        self.replies.clear()
        self.declined.clear()
