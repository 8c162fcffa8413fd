"""The fence against writes that waited for the claim row's lock (issue 25, defects 1 and 2).

Under READ COMMITTED a PostgreSQL statement that waited for a row lock re-checks only that row,
and only if it changed: a clock read, or a subquery on another table, before the wait stood.
Each test holds the claim row in a transaction of its own, lets the store's write wait on it
(a latch: the server shows the write waiting for a lock), changes the world meanwhile, then lets
the write go. On SQLite a write transaction holds the database's write lock from its start, so
the same API cannot interleave there: the SQLite cases show the fence holding when the order is
the same (the change first, then the write).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from sessionflow.errors import ClaimLostError, StaleAttemptError
from store import Store
from store.claims import Claim
from store.tool_runs import ToolAttempt, ToolRuns
from tests.conftest import Target
from tests.store.conftest import libpq
from tests.store.test_settle import called, succeeded


@pytest.fixture
async def pg(own_database: str) -> AsyncIterator[tuple[Store, str]]:
    """A store with a 3 s lease on a database of its own (its lock waits are the test's)."""
    store = await Target(own_database).open(lease_ms=3000)
    yield store, own_database
    await store.close()


async def _db_now(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT floor(extract(epoch from clock_timestamp()) * 1000)")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def _until_waiting_for_a_lock(conn: psycopg.AsyncConnection[Any]) -> None:
    """Until a backend of this database waits for a lock (the store's write, on the row)."""
    async with asyncio.timeout(30):
        while True:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.01)


async def _until_clock_past(conn: psycopg.AsyncConnection[Any], at_ms: int) -> None:
    async with asyncio.timeout(30):
        while await _db_now(conn) <= at_ms:
            await asyncio.sleep(0.01)


async def test_an_expired_claim_does_not_renew_itself_after_waiting_for_a_lock(
    pg: tuple[Store, str],
) -> None:
    """Defect 2: the renewal waited on the claim row, locked by a transaction that only locked
    it and then rolled back; the lease ran out meanwhile. Judged on the clock read before the
    wait, the expired claim renewed itself."""
    store, url = pg
    renewed, _run, _part = await called(store)
    claim = await store.claims.current(renewed.session_id)  # the expiry its last write set
    assert claim is not None
    async with (
        await psycopg.AsyncConnection.connect(libpq(url), autocommit=True) as watcher,
        await psycopg.AsyncConnection.connect(libpq(url)) as locker,
    ):
        await _until_clock_past(watcher, claim.expires_at - 400)  # live, for a moment more
        await locker.execute(
            "SELECT 1 FROM session_execution WHERE session_id = %s FOR UPDATE",
            [claim.session_id],
        )
        renewal = asyncio.create_task(store.claims.renew(claim))
        await _until_waiting_for_a_lock(watcher)
        await _until_clock_past(watcher, claim.expires_at)
        await locker.rollback()
        with pytest.raises(ClaimLostError):
            await renewal
    current = await store.claims.current(claim.session_id)
    assert current is not None and current.expires_at == claim.expires_at  # not renewed


async def _taken_while_a_write_waits(
    store: Store, url: str, claim: Claim, run: ToolAttempt, write: Any
) -> Any:
    """Attempt 2 takes the call in a transaction that holds the claim row; attempt 1's
    ``write`` starts and waits for that row; attempt 2 commits; attempt 1's write returns."""
    newer = ToolAttempt(run.session_id, run.execution_id, run.assistant_message_id, run.call_id, 2)
    async with await psycopg.AsyncConnection.connect(libpq(url), autocommit=True) as watcher:
        async with store.claims.fenced(claim, run=newer) as tx:
            await ToolRuns().take(tx, newer)
            stale = asyncio.create_task(write())
            await _until_waiting_for_a_lock(watcher)
        return await asyncio.gather(stale, return_exceptions=True)


async def test_an_older_tool_attempt_cannot_write_after_a_newer_one_took_the_call(
    pg: tuple[Store, str],
) -> None:
    """Defect 1, the general path: attempt 1's fenced write (``run=``) waited on the claim row
    while attempt 2's take held it; the later-attempt check kept the statement's snapshot, and
    attempt 1's write committed after attempt 2 owned the call."""
    store, url = pg
    claim, run, _part = await called(store)
    await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, run), run=run)

    async def nothing(_tx: Any) -> str:
        return "written"

    (outcome,) = await _taken_while_a_write_waits(
        store, url, claim, run, lambda: store.claims.run_fenced(claim, nothing, run=run)
    )
    assert isinstance(outcome, StaleAttemptError), outcome


async def test_an_older_tool_attempt_cannot_settle_after_a_newer_one_took_the_call(
    pg: tuple[Store, str],
) -> None:
    """Defect 1, the one-statement settlement (``Store.settle_call``)."""
    store, url = pg
    claim, run, before = await called(store)
    await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, run), run=run)
    log = (await store.events.read_after(claim.session_id)).events
    (outcome,) = await _taken_while_a_write_waits(
        store, url, claim, run, lambda: store.settle_call(claim, run, succeeded(run), before)
    )
    assert outcome is None  # refused: handed to the general path, which refuses it too
    assert (await store.events.read_after(claim.session_id)).events == log
    with pytest.raises(StaleAttemptError):
        await store.claims.run_fenced(claim, lambda tx: ToolRuns().check(tx, run), run=run)


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
async def test_on_sqlite_a_write_after_a_newer_take_or_the_expiry_is_refused(store: Store) -> None:
    """On SQLite the store's writes cannot interleave (one write transaction at a time, its
    statements seeing every commit before it): in the same order, the fence holds."""
    claim, run, _part = await called(store)
    await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, run), run=run)
    newer = ToolAttempt(run.session_id, run.execution_id, run.assistant_message_id, run.call_id, 2)
    await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, newer), run=newer)

    async def nothing(_tx: Any) -> None:
        return None

    with pytest.raises(StaleAttemptError):
        await store.claims.run_fenced(claim, nothing, run=run)
