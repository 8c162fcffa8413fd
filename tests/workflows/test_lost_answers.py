"""A turn's work can be durable while its answer is lost: the worker dies, or the activity
times out, after the turn committed and before Temporal recorded its completion (catalogue
C2 at the activity's edge). The drain must then go on from what the store holds, never from
the answer it did not get.

The answer is lost at the boundary between our activity and Temporal: a worker interceptor
(through the client, as the tracing one travels) lets the activity run to its end, then
withholds its completion until the server times the attempt out by its heartbeat.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
)
from temporalio.worker import Interceptor as WorkerInterceptor

from store import Store
from tests.invariants import final_log
from tests.workflows.harness import harness


class LosesAnswer(ClientInterceptor, WorkerInterceptor):
    """Withholds the next answer of activity ``name`` until ``release()``: Temporal hears
    nothing more of that attempt, as when its worker died right after the work."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.armed = True
        self.lost = 0
        self.released = asyncio.Event()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Withholding(next, self)

    def release(self) -> None:
        self.released.set()


class _Withholding(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, fault: LosesAnswer) -> None:
        super().__init__(next)
        self.fault = fault

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await super().execute_activity(input)
        if self.fault.armed and activity.info().activity_type == self.fault.name:
            self.fault.armed = False
            self.fault.lost += 1
            # No heartbeat from here on: the server times the attempt out, and the late
            # answer given after the release is refused.
            await self.fault.released.wait()
        return result


async def test_a_turn_that_settled_its_step_and_lost_its_answer_is_not_asked_again(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """A step without tools ends with its turn (``stream_turn`` settles it). When that turn's
    answer is lost after its settlement committed, the workflow closes the "lost" turn, finds
    the step settled by the turn itself and takes it as settled: no restart message, no second
    request after the model's final answer."""
    fault = LosesAnswer("stream_turn")
    client = Client(**{**temporal_env.client.config(), "interceptors": [fault]})
    try:
        async with harness(client, store, tmp_path) as h:
            sid = await h.session([{"text": "done"}])
            await h.client.prompt(sid, "Go")
            await h.client.wait_idle(sid, timeout=60)
            fault.release()
            log = await final_log(store, sid)
            messages = await h.messages(sid)
            requests = h.requests()
    finally:
        fault.release()
    assert fault.lost == 1
    assert len(requests) == 1
    types = [e.data.type for e in log]
    assert types.count("session.execution.succeeded") == 1
    assert types[-1] == "session.execution.succeeded"
    assert "session.synthetic" not in types and "session.step.failed" not in types
    assert types.count("session.step.ended") == 1
    assistants = [m for m in messages if m.type == "assistant"]
    assert [(a.finish, a.error) for a in assistants] == [("stop", None)]
