"""``run_tool`` attempts: an older attempt is fenced out, and a retry runs what never started.

Temporal retries an activity while its older attempt may still run. Which attempt runs is what
these tests control, so each attempt runs in the SDK's ``ActivityEnvironment`` with its
``attempt`` set; the store is real (SQLite and PostgreSQL), and the order of the attempts is
fixed by latches inside the tool, never by time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from pathlib import Path

import pytest
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.runtime import Runtime, to_ref
from activities.tool_run import ToolActivities
from activities.tools.base import Tool, ToolContext, ToolOutput, ToolRegistry
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef
from sessionflow.models.drain import ToolInput, ToolOutcome
from store import Store, open_store
from store.claims import Claim
from tests.conftest import Target

MESSAGE, CALL = "msg_tools", "call_1"


class Input(BaseModel):
    pass


class Latched(Tool[Input]):
    """Each run (in the order they start) waits for its own latch, reports progress once, and
    returns its number; ``began`` tells the test that a run is inside the tool."""

    name = "latched"
    description = "Wait for the test, then say which run this was."
    input_model = Input
    retry_safe = True

    def __init__(self) -> None:
        self.began = [asyncio.Event() for _ in range(3)]
        self.release = [asyncio.Event() for _ in range(3)]
        self.runs = 0

    async def execute(self, input: Input, context: ToolContext) -> ToolOutput:
        run, self.runs = self.runs, self.runs + 1
        self.began[run].set()
        await self.release[run].wait()
        await context.progress({"run": run}, f"run {run}")
        return ToolOutput.text(f"run {run}", run=run)


class Unsafe(Latched):
    name = "unsafe"
    retry_safe = False


@dataclasses.dataclass
class Call:
    """One recorded tool call and a way to run an attempt of ``run_tool`` at it."""

    store: Store
    claim: Claim
    tools: ToolRegistry
    name: str

    def attempt(self, n: int, *, store: Store | None = None) -> Attempt:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, attempt=n)
        activities = ToolActivities(Runtime(store or self.store, self.tools))
        request = ToolInput(
            claim=to_ref(self.claim), assistant_message_id=MESSAGE, call_id=CALL, name=self.name
        )
        return Attempt(env, env.run(activities.run_tool, request))

    async def events(self) -> list[ev.Event]:
        page = await self.store.events.read_after(self.claim.session_id, 0, limit=1000)
        return [e.data for e in page.events if getattr(e.data, "call_id", None) == CALL]


@dataclasses.dataclass
class Attempt:
    env: ActivityEnvironment
    running: Awaitable[ToolOutcome]

    def start(self) -> asyncio.Task[ToolOutcome]:
        return asyncio.ensure_future(self.running)


async def recorded_call(store: Store, tmp_path: Path, tool: Latched) -> Call:
    session = await store.sessions.create(str(tmp_path))
    claim = await store.claims.acquire(session.id, "exec_1", "owner_1")
    ids = {"session_id": session.id, "assistant_message_id": MESSAGE}
    model = ModelRef(provider_id="scripted", id="x")
    await store.append(
        claim,
        [
            ev.StepStarted(**ids, agent="build", model=model),
            ev.ToolCalled(**ids, call_id=CALL, name=tool.name, input={}),
        ],
    )
    return Call(store, claim, ToolRegistry([tool]), tool.name)


def kinds(events: list[ev.Event]) -> list[str]:
    return [event.type for event in events]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_an_older_attempt_cannot_write_after_a_later_one_settled_the_call(
    store: Store, tmp_path: Path
) -> None:
    tool = Latched()
    call = await recorded_call(store, tmp_path, tool)
    zombie = call.attempt(1).start()
    await tool.began[0].wait()  # attempt 1 runs the tool; Temporal has given up on it
    tool.release[1].set()
    outcome = await call.attempt(2).running
    assert outcome.status == "completed"
    tool.release[0].set()  # the zombie wakes up and reports progress
    with pytest.raises(ApplicationError) as fenced:
        await zombie
    assert (fenced.value.type, fenced.value.non_retryable) == ("StaleAttemptError", True)
    assert "tool call_1 attempt 1 after attempt 2 began" in str(fenced.value)
    events = await call.events()
    assert kinds(events) == ["session.tool.called", "session.tool.progress", "session.tool.success"]
    assert [e.structured for e in events[1:]] == [{"run": 1}, {"run": 1}]  # type: ignore[attr-defined]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_an_older_attempt_finishing_first_cannot_settle_over_the_later_one(
    store: Store, tmp_path: Path
) -> None:
    tool = Latched()
    call = await recorded_call(store, tmp_path, tool)
    zombie = call.attempt(1).start()
    await tool.began[0].wait()
    later = call.attempt(2).start()
    await tool.began[1].wait()  # attempt 2 took the call and runs the tool too
    tool.release[0].set()
    with pytest.raises(ApplicationError, match="attempt 1 after attempt 2 began"):
        await zombie
    tool.release[1].set()
    assert (await later).status == "completed"
    events = await call.events()
    assert kinds(events) == ["session.tool.called", "session.tool.progress", "session.tool.success"]
    assert events[-1].structured == {"run": 1}  # type: ignore[attr-defined]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_an_unsafe_tool_whose_first_attempt_failed_before_it_started_runs_on_retry(
    store: Store, target: Target, tmp_path: Path
) -> None:
    tool = Unsafe()
    tool.release[0].set()
    call = await recorded_call(store, tmp_path, tool)
    blip = await unreachable(target, tmp_path)
    try:
        # The attempt waits out the outage for up to its claim's lease before it fails: a
        # short one here, so that it gives up soon.
        short = dataclasses.replace(call, claim=dataclasses.replace(call.claim, lease_ms=1000))
        with pytest.raises(Exception, match=r"database is unavailable|OperationalError"):
            await short.attempt(1, store=blip).running
    finally:
        await blip.close()
    assert tool.runs == 0
    outcome = await call.attempt(2).running
    assert (outcome.status, tool.runs) == ("completed", 1)
    assert kinds(await call.events())[-1] == "session.tool.success"


@pytest.mark.unsettled  # it ends inside a busy period
async def test_an_unsafe_tool_an_earlier_attempt_started_settles_as_outcome_unknown(
    store: Store, tmp_path: Path
) -> None:
    tool = Unsafe()
    call = await recorded_call(store, tmp_path, tool)
    first = call.attempt(1)
    running = first.start()
    await tool.began[0].wait()
    first.env.cancel()  # its worker is lost with the tool half done
    with pytest.raises(asyncio.CancelledError):
        await running
    outcome = await call.attempt(2).running
    assert outcome.status == "error" and outcome.error is not None
    assert outcome.error.type == "tool.outcome-unknown"
    assert tool.runs == 1


async def unreachable(target: Target, tmp_path: Path) -> Store:
    """A store whose database cannot be reached: every statement fails to connect."""
    if target.backend == "sqlite":
        (tmp_path / "blip.db").mkdir()  # a directory: SQLite cannot open it
        return await open_store(f"sqlite+aiosqlite:///{tmp_path / 'blip.db'}", migrate=False)
    return await open_store(
        "postgresql+psycopg://root@127.0.0.1:1/test", schema=target.schema, migrate=False
    )
