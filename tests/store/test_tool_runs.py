"""Tool runs: the latest attempt of ``run_tool`` per call fences the call's writes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from sessionflow.errors import ClaimLostError, StaleAttemptError
from store import Store
from store.claims import Claim
from store.schema import Base
from store.tool_runs import ToolAttempt


async def claimed(store: Store) -> Claim:
    session = await store.sessions.create("/work")
    return await store.claims.acquire(session.id, "exec_1", "owner_1")


def attempt(claim: Claim, n: int, call_id: str = "call_1") -> ToolAttempt:
    return ToolAttempt(claim.session_id, claim.execution_id, "msg_1", call_id, n)


async def test_take_returns_the_attempt_that_took_the_call_before(store: Store) -> None:
    claim = await claimed(store)
    async with store.claims.fenced(claim) as tx:
        assert await store.tool_runs.take(tx, attempt(claim, 1)) is None
        assert await store.tool_runs.take(tx, attempt(claim, 3)) == 1
        assert await store.tool_runs.take(tx, attempt(claim, 1, "call_2")) is None
    async with store.claims.fenced(claim) as tx:
        assert await store.tool_runs.take(tx, attempt(claim, 3)) == 3


async def test_the_same_attempt_of_another_run_may_have_run_the_tool(store: Store) -> None:
    """A reset run re-issues the old run's attempt with the same number: it is told that an
    attempt may have run the tool, and owns the call from then on; the same attempt of the
    same run taking it again (a retry of the take) is its own."""
    claim = await claimed(store)
    old, new = (replace(attempt(claim, 1), owner=f"wf/{run}") for run in ("run-1", "run-2"))
    async with store.claims.fenced(claim) as tx:
        assert not (await store.tool_runs.take_run(tx, old)).may_have_run(1)
        assert not (await store.tool_runs.take_run(tx, old)).may_have_run(1)
        taken = await store.tool_runs.take_run(tx, new)
        assert (taken.previous, taken.other_run) == (1, True) and taken.may_have_run(1)
        assert not (await store.tool_runs.take_run(tx, new)).may_have_run(1)


async def test_an_older_attempt_is_refused_and_writes_nothing(store: Store) -> None:
    claim = await claimed(store)
    async with store.claims.fenced(claim) as tx:
        await store.tool_runs.take(tx, attempt(claim, 2))
    for write in (store.tool_runs.take, store.tool_runs.check):
        with pytest.raises(StaleAttemptError, match="tool call_1 attempt 1 after attempt 2"):
            async with store.claims.fenced(claim) as tx:
                await write(tx, attempt(claim, 1))
    async with store.claims.fenced(claim) as tx:
        await store.tool_runs.check(tx, attempt(claim, 2))
        await store.tool_runs.check(tx, attempt(claim, 1, "call_2"))  # untaken: nothing to fence
        assert await store.tool_runs.take(tx, attempt(claim, 2)) == 2


async def test_a_fence_for_a_call_refuses_an_older_attempt_in_its_renewal(store: Store) -> None:
    """``fenced(claim, run=...)``: the renewal itself refuses a call that a later attempt took
    (StaleAttemptError, nothing written), and a lost claim is still ClaimLostError."""
    claim = await claimed(store)
    async with store.claims.fenced(claim) as tx:
        await store.tool_runs.take(tx, attempt(claim, 2))
    with pytest.raises(StaleAttemptError, match="tool call_1 attempt 1 after attempt 2"):
        async with store.claims.fenced(claim, run=attempt(claim, 1)) as tx:
            raise AssertionError("the body of a refused fence never runs")
    async with store.claims.fenced(claim, run=attempt(claim, 2)) as tx:
        await store.tool_runs.check(tx, attempt(claim, 2))
    async with store.claims.fenced(claim, run=attempt(claim, 1, "call_2")):
        pass  # an untaken call: nothing to fence
    await store.claims.release(claim)
    with pytest.raises(ClaimLostError):
        async with store.claims.fenced(claim, run=attempt(claim, 2)):
            raise AssertionError("the body of a refused fence never runs")


async def test_the_migrations_build_the_schema_the_models_declare(store: Store) -> None:
    async with store.db.write_engine.connect() as conn:
        diff = await conn.run_sync(
            lambda sync: compare_metadata(MigrationContext.configure(sync), Base.metadata)
        )
    assert diff == []
