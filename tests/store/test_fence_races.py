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
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from sessionflow.errors import ClaimLostError, StaleAttemptError
from sessionflow.models import events as ev
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


async def _expiring_in(
    store: Store, conn: psycopg.AsyncConnection[Any], claim: Claim, ms: int
) -> Claim:
    """The claim with its lease cut to end ``ms`` from the database's now (negative: ended),
    so a test waits a moment for the expiry, not a whole lease."""
    await conn.execute(
        "UPDATE session_execution SET expires_at ="
        " floor(extract(epoch from clock_timestamp()) * 1000)::bigint + %s WHERE session_id = %s",
        [ms, claim.session_id],
    )
    current = await store.claims.current(claim.session_id)
    assert current is not None
    return current


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


FIRST_TOOK = pytest.mark.parametrize(
    "first_took", [True, False], ids=["run_updated", "run_inserted"]
)


@FIRST_TOOK
async def test_an_older_tool_attempt_cannot_write_after_a_newer_one_took_the_call(
    pg: tuple[Store, str], first_took: bool
) -> None:
    """Defect 1, the general path: attempt 1's fenced write (``run=``) waited on the claim row
    while attempt 2's take held it; the later-attempt check kept the statement's snapshot, and
    attempt 1's write committed after attempt 2 owned the call. ``run_inserted``: attempt 1 of
    a retry-safe tool takes nothing (``activities/tool_run.py``), so attempt 2's take inserts
    the call's row, which the waiting statement cannot see."""
    store, url = pg
    claim, run, _part = await called(store)
    if first_took:
        await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, run), run=run)
    (outcome,) = await _taken_while_a_write_waits(
        store, url, claim, run, lambda: store.claims.run_fenced(claim, _nothing, run=run)
    )
    assert isinstance(outcome, StaleAttemptError), outcome


@FIRST_TOOK
async def test_an_older_tool_attempt_cannot_settle_after_a_newer_one_took_the_call(
    pg: tuple[Store, str], first_took: bool
) -> None:
    """Defect 1, the one-statement settlement (``Store.settle_call``)."""
    store, url = pg
    claim, run, before = await called(store)
    if first_took:
        await store.claims.run_fenced(claim, lambda tx: ToolRuns().take(tx, run), run=run)
    log = (await store.events.read_after(claim.session_id)).events
    (outcome,) = await _taken_while_a_write_waits(
        store, url, claim, run, lambda: store.settle_call(claim, run, succeeded(run), before)
    )
    assert outcome is None  # refused: handed to the general path, which refuses it too
    assert (await store.events.read_after(claim.session_id)).events == log
    with pytest.raises(StaleAttemptError):
        await store.claims.run_fenced(claim, lambda tx: ToolRuns().check(tx, run), run=run)


Write = Callable[[], Awaitable[Any]]


async def _xmin(conn: psycopg.AsyncConnection[Any], sid: str) -> str:
    cur = await conn.execute("SELECT xmin::text FROM session_execution WHERE session_id=%s", [sid])
    row = await cursor_one(cur)
    return str(row[0])


async def cursor_one(cur: Any) -> Any:
    row = await cur.fetchone()
    assert row is not None
    return row


async def _writes(
    store: Store, conn: psycopg.AsyncConnection[Any], claim: Claim, run: ToolAttempt, before: Any
) -> dict[str, Write]:
    """Each fast.py path (and claims.py's), prepared before the race starts."""
    sid, mid = claim.session_id, run.assistant_message_id
    version = await _xmin(conn, sid)
    step = await store.step_snapshot(sid, mid)
    assert step is not None
    failed = ev.ToolFailed(
        session_id=sid,
        assistant_message_id=mid,
        call_id="c",
        error={"type": "tool.execution", "message": "x"},
    )
    delta = ev.TextDelta(session_id=sid, assistant_message_id=mid, ordinal=0, delta="d")
    done = ev.ExecutionSucceeded(session_id=sid, execution_id=claim.execution_id)
    return {
        "append": lambda: store.append(claim, [delta]),
        "append_attempt": lambda: store.append(claim, [delta], step_attempt=5),
        "settle_call": lambda: store.settle_call(claim, run, succeeded(run), before),
        "open_turn": lambda: store.open_turn(
            claim,
            SimpleNamespace(version=version),
            step_attempt=5,
            phase=("ready", mid),  # type: ignore[arg-type]
        ),
        "end_step": lambda: store.end_step(claim, step, [failed], step_attempt=5, phase="ready"),
        "end_execution": lambda: store.end_execution(claim, done, "evt_term", release=True),
        "end_execution_keep": lambda: store.end_execution(claim, done, "evt_term", release=False),
        "renew": lambda: store.claims.renew(claim),
        "release": lambda: store.claims.release(claim),
        "run_fenced": lambda: store.claims.run_fenced(claim, _nothing, step_attempt=5),
    }


async def _nothing(_tx: Any) -> str:
    return "written"


REFUSED = (None, False)
NAMES = [
    "append",
    "append_attempt",
    "settle_call",
    "open_turn",
    "end_step",
    "end_execution",
    "end_execution_keep",
    "renew",
    "release",
    "run_fenced",
]


async def _called_now(store: Store) -> tuple[Claim, ToolAttempt, Any]:
    """A recorded call (``called``), with its claim as the store holds it now (the expiry
    its last write set)."""
    claim, run, before = await called(store)
    current = await store.claims.current(claim.session_id)
    assert current is not None
    return current, run, before


def _refused(outcome: Any) -> bool:
    if isinstance(outcome, ClaimLostError | StaleAttemptError):
        return True
    return outcome is None or outcome is False


@pytest.mark.parametrize("name", NAMES)
async def test_no_write_path_renews_an_expired_claim_after_a_lock_only_wait(
    pg: tuple[Store, str], name: str
) -> None:
    """Defect 2, on every path (the hot path's statements and the general ones, ``renew``
    among them): the write waited on the claim row, locked by a transaction that only locked
    it and then rolled back; the lease ran out meanwhile. Judged on the clock read before the
    wait, the expired claim renewed itself."""
    store, url = pg
    claim, run, before = await _called_now(store)
    async with (
        await psycopg.AsyncConnection.connect(libpq(url), autocommit=True) as watcher,
        await psycopg.AsyncConnection.connect(libpq(url)) as locker,
    ):
        claim = await _expiring_in(store, watcher, claim, 400)
        writes = await _writes(store, watcher, claim, run, before)
        log = (await store.events.read_after(claim.session_id)).events
        await locker.execute(
            "SELECT 1 FROM session_execution WHERE session_id = %s FOR UPDATE", [claim.session_id]
        )
        task = asyncio.create_task(writes[name]())
        await _until_waiting_for_a_lock(watcher)
        await _until_clock_past(watcher, claim.expires_at)
        await locker.rollback()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
    assert _refused(outcome), repr(outcome)
    current = await store.claims.current(claim.session_id)
    assert current is not None and current.expires_at == claim.expires_at
    assert (await store.events.read_after(claim.session_id)).events == log


@pytest.mark.parametrize("name", NAMES)
async def test_no_write_path_of_a_taken_over_claim_commits_after_the_takeover(
    pg: tuple[Store, str], name: str
) -> None:
    """A takeover (epoch + 1) holds the row while a stale write of every path waits on it."""
    store, url = pg
    claim, run, before = await _called_now(store)
    async with await psycopg.AsyncConnection.connect(libpq(url), autocommit=True) as watcher:
        claim = await _expiring_in(store, watcher, claim, -10)
        writes = await _writes(store, watcher, claim, run, before)
        async with store.claims.acquiring(claim.session_id, "exec_b", "owner-b") as (new, _tx):
            task = asyncio.create_task(writes[name]())
            await _until_waiting_for_a_lock(watcher)
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        log_after = (await store.events.read_after(claim.session_id)).events
    assert _refused(outcome), repr(outcome)
    current = await store.claims.current(claim.session_id)
    assert current is not None and current.execution_id == "exec_b"
    assert current.epoch == new.epoch and current.expires_at == new.expires_at
    # Nothing of the stale execution's after the takeover.
    stale = [e for e in log_after if getattr(e, "epoch", None) == claim.epoch and e.seq > 0]
    assert all(e.type != "session.text.delta" for e in stale), stale


@pytest.mark.parametrize("name", ["renew", "append", "run_fenced", "settle_call"])
async def test_a_live_claim_renewed_by_a_sibling_during_the_wait_is_not_refused(
    pg: tuple[Store, str], name: str
) -> None:
    """Another transaction of the same live claim renews it (as every fenced write does) and
    holds the row while the previous expiry passes. The waiting write's UPDATE judges the
    snapshot's row (old expiry) with the clock read after the lock: a live claim is refused,
    and the general path's explanation (``_lost``) finds it live."""
    store, url = pg
    claim, run, before = await _called_now(store)
    async with await psycopg.AsyncConnection.connect(libpq(url), autocommit=True) as watcher:
        claim = await _expiring_in(store, watcher, claim, 400)
        writes = await _writes(store, watcher, claim, run, before)
        async with store.claims.fenced(claim) as _tx:  # renews to now + 3 s, holds the row
            task = asyncio.create_task(writes[name]())
            await _until_waiting_for_a_lock(watcher)
            await _until_clock_past(watcher, claim.expires_at + 50)
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
    current = await store.claims.current(claim.session_id)
    assert current is not None
    live = current.expires_at > claim.expires_at
    assert live
    assert not isinstance(outcome, BaseException), f"live claim refused: {outcome!r}"
    if name == "settle_call" and outcome is None:
        # The one statement hands a wait on a changed claim row to the general path (its
        # snapshot could not see a tool run inserted meanwhile), which takes it.
        await store.claims.run_fenced(claim, lambda tx: ToolRuns().check(tx, run), run=run)
    else:
        assert outcome is not None, "live claim refused by the hot path"


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)
@pytest.mark.breaks_invariants("I4")  # its step starts unclaimed (test_settle.called)
@pytest.mark.unsettled  # it ends inside a busy period
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
