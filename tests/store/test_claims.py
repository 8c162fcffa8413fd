"""The claim: acquisition, takeover, renewal, release, fencing, attempts (DESIGN "The claim")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import pytest
import sqlalchemy as sa

from sessionflow.errors import (
    ClaimHeldError,
    ClaimLostError,
    SessionNotFoundError,
    StaleAttemptError,
    StoreUnavailableError,
)
from sessionflow.models import events as ev
from store import Store
from store.claims import Claim
from store.dialect import now_ms
from tests.conftest import StoreFactory, Target
from tests.store.helpers import (
    backend_pid,
    count,
    expire_claim,
    rows,
    until_waiting_for,
    writer_begun,
)
from tests.store.procs import context as procs_context
from tests.store.procs import skewed_claimant, spawn


async def new_session(store: Store) -> str:
    return (await store.sessions.create("/work")).id


async def test_acquire_creates_a_live_claim_with_the_first_epoch(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    assert (claim.epoch, claim.phase, claim.step_attempt) == (1, "ready", 0)
    assert await rows(store, "SELECT id, owner_id, epoch FROM session_execution") == [
        ("exec_a", "owner-a", 1)
    ]


async def test_a_live_claim_of_another_execution_is_held(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    with pytest.raises(ClaimHeldError) as held:
        await store.claims.acquire(sid, "exec_b", "owner-b")
    assert held.value.expires_at_ms == claim.expires_at
    assert held.value.execution_id == "exec_a"
    # Seen by the database clock (F7: a retry waits by it, not by the worker's).
    assert held.value.now_ms is not None
    assert 0 < held.value.remaining_ms() <= store.claims.lease_ms
    assert await count(store, "session_execution") == 1
    assert await count(store, "session_recovery") == 0


async def test_a_live_claim_named_dead_is_taken_over_at_once(store: Store) -> None:
    """Temporal said the holder's run closed (``activities/session.py: closed_owner``): the
    live claim is taken over with a new epoch and the dead execution recorded for recovery;
    a live claim of any other execution is still held."""
    sid = await new_session(store)
    await store.claims.acquire(sid, "exec_a", "owner-a")
    with pytest.raises(ClaimHeldError):
        await store.claims.acquire(sid, "exec_b", "owner-b", dead="exec_other")
    taken = await store.claims.acquire(sid, "exec_b", "owner-b", dead="exec_a")
    assert (taken.execution_id, taken.epoch) == ("exec_b", 2)
    assert [r.execution_id for r in await store.claims.recoveries(sid)] == ["exec_a"]


async def test_reown_moves_a_live_claim_to_the_run_that_carries_it(store: Store) -> None:
    sid = await new_session(store)
    first = await store.claims.acquire(sid, "exec_a", "wf/run-1")
    carried = replace(first, owner_id="wf/run-2")
    with pytest.raises(ClaimLostError, match="owned by"):
        await store.claims.renew(carried)
    assert await store.claims.owner(carried) == "wf/run-1"
    assert await store.claims.reown(carried, "wf/run-1")
    await store.claims.renew(carried)
    with pytest.raises(ClaimLostError, match="owned by"):
        await store.claims.renew(first)  # the run before it is refused from now on
    assert not await store.claims.reown(replace(carried, epoch=5), "wf/run-2")  # not its claim
    # A run that saw the owner before another run took the claim cannot take it back.
    assert not await store.claims.reown(first, "wf/run-1")
    await store.claims.renew(carried)


async def test_acquiring_again_for_the_same_live_execution_returns_its_claim(store: Store) -> None:
    sid = await new_session(store)
    first = await store.claims.acquire(sid, "exec_a", "owner-a")
    again = await store.claims.acquire(sid, "exec_a", "owner-a")
    assert again.epoch == first.epoch and again.expires_at >= first.expires_at


@pytest.mark.unsettled  # it ends inside a busy period
async def test_what_a_new_claim_starts_commits_with_it_stamped_or_not_at_all(store: Store) -> None:
    sid = await new_session(store)
    started = ev.ExecutionStarted(session_id=sid, execution_id="exec_a")
    with pytest.raises(RuntimeError, match="after the claim"):
        async with store.claims.acquiring(sid, "exec_a", "owner-a") as (_claim, tx):
            await store.events.publish(started, tx=tx)
            raise RuntimeError("failed after the claim")
    assert await count(store, "session_execution") == 0
    assert await rows(store, "SELECT type FROM event WHERE type LIKE 'session.execution%'") == []
    async with store.claims.acquiring(sid, "exec_a", "owner-a") as (claim, tx):
        await store.events.publish(started, tx=tx)
    stamped = "SELECT execution_id, epoch FROM event WHERE type LIKE 'session.execution.started%'"
    assert await rows(store, stamped) == [("exec_a", claim.epoch)]
    assert await rows(store, "SELECT id FROM session_execution") == [("exec_a",)]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_an_admission_during_an_acquisition_does_not_deadlock(store: Store) -> None:
    """The admission takes the sequence row, then the session row; so must the acquisition."""
    sid = await new_session(store)
    started = ev.ExecutionStarted(session_id=sid, execution_id="exec_a")
    async with store.claims.acquiring(sid, "exec_a", "owner-a") as (_claim, tx):
        admission = asyncio.create_task(store.inputs.admit(sid, "hi"))
        await asyncio.sleep(0.3)  # on PostgreSQL it now holds the sequence row
        await store.events.publish(started, tx=tx)
    receipt = await asyncio.wait_for(admission, 10)
    assert (await store.inputs.get(receipt.id)) is not None
    assert await count(store, "session_execution") == 1


async def test_a_release_inside_a_transaction_goes_only_if_it_commits(store: Store) -> None:
    """Catalogue F10: the release path."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    with pytest.raises(RuntimeError):
        async with store.claims.fenced(claim) as tx:
            await store.claims.release_in(tx, claim)
            raise RuntimeError("the terminal event failed")
    assert await count(store, "session_execution") == 1
    async with store.claims.fenced(claim) as tx:
        await store.claims.release_in(tx, claim)
    assert await count(store, "session_execution") == 0
    with pytest.raises(ClaimLostError):
        async with store.db.write() as tx:
            await store.claims.release_in(tx, claim)


async def test_acquire_of_an_unknown_session_fails(store: Store) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.claims.acquire("ses_missing", "exec_a", "owner-a")


async def test_epochs_strictly_increase_across_release_and_takeover(store: Store) -> None:
    """Catalogue F8: ABA and id reuse."""
    sid = await new_session(store)
    epochs = []
    claim = await store.claims.acquire(sid, "exec_1", "owner")
    epochs.append(claim.epoch)
    await store.claims.release(claim)
    claim = await store.claims.acquire(sid, "exec_2", "owner")
    epochs.append(claim.epoch)
    await expire_claim(store, sid)
    claim = await store.claims.acquire(sid, "exec_3", "owner")
    epochs.append(claim.epoch)
    assert epochs == [1, 2, 3]


CLAIMS = 500  # as many as take a few seconds on each database here, under load


async def test_no_two_of_many_claims_share_a_fencing_token(store: Store) -> None:
    """Catalogue F8: ids unique across many claims. One session is claimed 500 times by one
    execution id, reused every time (the worst case: the workflow's ids, run id and period, are
    never reused), each claim released or left to expire in turn. The epochs are exactly 1 ..
    500, so no two claims share a fencing token (execution id, epoch); once the next claim is
    held, the first, a middle and the last of them are all refused and write nothing."""
    sid = await new_session(store)
    claims = []
    for number in range(CLAIMS):
        claim = await store.claims.acquire(sid, "exec_reused", "owner")
        claims.append(claim)
        if number % 2:
            await store.claims.release(claim)
        else:
            await expire_claim(store, sid)
    assert [c.epoch for c in claims] == list(range(1, CLAIMS + 1))
    assert len({(c.execution_id, c.epoch) for c in claims}) == CLAIMS
    live = await store.claims.acquire(sid, "exec_reused", "owner")
    assert live.epoch == CLAIMS + 1
    before = await store.events.latest_sequence(sid)
    for stale in (claims[0], claims[CLAIMS // 2], claims[-1]):
        with pytest.raises(ClaimLostError):
            await store.claims.renew(stale)
        with pytest.raises(ClaimLostError):
            async with store.claims.fenced(stale) as tx:
                await store.events.publish(ev.Synthetic(session_id=sid, text="stale"), tx=tx)
    assert await store.events.latest_sequence(sid) == before
    assert (await store.claims.renew(live)).epoch == live.epoch


async def test_an_expired_claim_never_renews_itself(store: Store) -> None:
    """Catalogue F5: an expired claim never renews itself."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    await expire_claim(store, sid)
    with pytest.raises(ClaimLostError, match="lease expired"):
        await store.claims.renew(claim)
    with pytest.raises(ClaimLostError):
        async with store.claims.fenced(claim):
            pass
    row = await rows(store, "SELECT expires_at FROM session_execution")
    assert row[0][0] == claim.expires_at - 3_600_000
    revived = await store.claims.acquire(sid, "exec_a", "owner-a")
    assert revived.epoch == claim.epoch + 1
    with pytest.raises(ClaimLostError, match="taken over by execution exec_a"):
        await store.claims.renew(claim)
    assert (await store.claims.renew(revived)).epoch == revived.epoch


async def test_renew_extends_a_live_claim(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a", lease_ms=5_000)
    await asyncio.sleep(0.05)
    renewed = await store.claims.renew(claim)
    assert renewed.expires_at > claim.expires_at


async def test_takeover_records_exactly_one_recovery_row(store: Store) -> None:
    sid = await new_session(store)
    dead = await store.claims.acquire(sid, "exec_dead", "owner-a")
    await store.claims.set_phase(dead, "unknown", assistant_message_id="msg_turn")
    await expire_claim(store, sid)
    successor = await store.claims.acquire(sid, "exec_next", "owner-b")
    assert successor.epoch == dead.epoch + 1
    recoveries = await store.claims.recoveries(sid)
    assert [
        (r.execution_id, r.phase, r.continuation_message_id, r.attempts) for r in recoveries
    ] == [("exec_dead", "unknown", "msg_turn", 0)]
    assert await count(store, "session_recovery") == 1
    assert await rows(store, "SELECT id FROM session_execution") == [("exec_next",)]


async def test_abab_the_first_owner_can_never_write_again(store: Store) -> None:
    """Catalogue F8: ABA and id reuse."""
    sid = await new_session(store)
    a = await store.claims.acquire(sid, "exec_a", "owner-a")
    await expire_claim(store, sid)
    b = await store.claims.acquire(sid, "exec_b", "owner-b")
    await store.claims.release(b)
    assert await count(store, "session_execution") == 0
    for attempt in (store.claims.renew(a), store.claims.release(a)):
        with pytest.raises(ClaimLostError, match="released"):
            await attempt
    with pytest.raises(ClaimLostError):
        async with store.claims.fenced(a) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="stale"), tx=tx)
    a_again = await store.claims.acquire(sid, "exec_a", "owner-a")
    assert a_again.epoch == 3
    with pytest.raises(ClaimLostError):
        await store.claims.renew(a)


async def test_a_fenced_write_after_the_claim_was_lost_is_rolled_back(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    await expire_claim(store, sid)
    before = await store.events.latest_sequence(sid)
    with pytest.raises(ClaimLostError):
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="late"), tx=tx)
    assert await store.events.latest_sequence(sid) == before
    assert await count(store, "session_message") == 0


async def test_a_failure_inside_a_fenced_transaction_rolls_everything_back(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    with pytest.raises(RuntimeError):
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="one"), tx=tx)
            raise RuntimeError("crash mid-transaction")
    assert await count(store, "session_message") == 0
    assert await store.events.latest_sequence(sid) == 0


async def test_fenced_events_are_stamped_with_the_claim(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    async with store.claims.fenced(claim) as tx:
        stored = await store.events.publish(ev.Synthetic(session_id=sid, text="hi"), tx=tx)
    assert (stored.execution_id, stored.epoch) == ("exec_a", claim.epoch)
    page = await store.events.read_after(sid, 0)
    assert [(e.execution_id, e.epoch) for e in page.events] == [("exec_a", claim.epoch)]


async def test_writes_from_an_older_step_attempt_are_rejected(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    async with store.claims.fenced(claim, step_attempt=2):
        pass
    with pytest.raises(StaleAttemptError, match="step attempt 1 after attempt 2"):
        async with store.claims.fenced(claim, step_attempt=1) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="zombie"), tx=tx)
    async with store.claims.fenced(claim, step_attempt=2) as tx:
        await store.events.publish(ev.Synthetic(session_id=sid, text="current"), tx=tx)
    messages = await store.sessions.messages(sid)
    assert [m.text for m in messages] == ["current"]  # type: ignore[union-attr]


async def test_release_deletes_and_frees_the_session_at_once(store: Store) -> None:
    """Catalogue F10: the release path."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    await store.claims.release(claim)
    assert await store.claims.current(sid) is None
    other = await store.claims.acquire(sid, "exec_b", "owner-b")
    assert other.epoch == 2
    with pytest.raises(ClaimLostError):
        await store.claims.release(claim)
    assert (await store.claims.current(sid)) is not None


async def test_a_takeover_waits_for_an_open_fenced_transaction(store: Store) -> None:
    """Delayed write (F3): the takeover cannot slip between the fence check and the commit."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a", lease_ms=60_000)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_writer() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="a"), tx=tx)
            entered.set()
            await release.wait()

    writer = asyncio.create_task(slow_writer())
    await entered.wait()
    taker = asyncio.create_task(store.claims.acquire(sid, "exec_b", "owner-b"))
    await asyncio.sleep(0.3)
    assert not taker.done()
    release.set()
    await writer
    with pytest.raises(ClaimHeldError):
        await taker
    assert [m.seq for m in await store.sessions.messages(sid)] == [1]


async def test_recovery_attempts_are_counted_and_inherited(store: Store) -> None:
    sid = await new_session(store)
    first = await store.claims.acquire(sid, "exec_1", "owner")
    await expire_claim(store, sid)
    second = await store.claims.acquire(sid, "exec_2", "owner")
    (recovery,) = await store.claims.recoveries(sid)
    async with store.claims.fenced(second) as tx:
        assert await store.claims.begin_recovery(tx, recovery) == 1
    assert await store.claims.recoveries(sid) == []
    await expire_claim(store, sid)
    third = await store.claims.acquire(sid, "exec_3", "owner")
    (inherited,) = await store.claims.recoveries(sid)
    assert (inherited.execution_id, inherited.attempts) == ("exec_2", 1)
    async with store.claims.fenced(third) as tx:
        assert await store.claims.begin_recovery(tx, inherited) == 2
        await store.claims.clear_recoveries(tx, sid)
    assert await count(store, "session_recovery") == 0
    assert first.epoch < second.epoch < third.epoch


async def test_recoveries_are_selected_oldest_first_without_errors(store: Store) -> None:
    sid = await new_session(store)
    await store.claims.acquire(sid, "exec_b", "owner")
    await expire_claim(store, sid)
    await store.claims.acquire(sid, "exec_a", "owner")
    await expire_claim(store, sid)
    claim = await store.claims.acquire(sid, "exec_c", "owner")
    recoveries = await store.claims.recoveries(sid)
    assert [r.execution_id for r in recoveries] == ["exec_b", "exec_a"]
    async with store.claims.fenced(claim) as tx:
        await store.claims.fail_recovery(tx, recoveries[0], "budget exhausted")
    assert [r.execution_id for r in await store.claims.recoveries(sid)] == ["exec_a"]


async def test_expired_lists_sessions_to_recover(store: Store) -> None:
    live, dead = await new_session(store), await new_session(store)
    await store.claims.acquire(live, "exec_live", "owner")
    await store.claims.acquire(dead, "exec_dead", "owner")
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql(
            "UPDATE session_execution SET expires_at = 0 WHERE id = 'exec_dead'"
        )
    assert await store.claims.expired() == [dead]


async def test_set_phase_is_fenced(store: Store) -> None:
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    updated = await store.claims.set_phase(claim, "continue", assistant_message_id="msg_1")
    assert (updated.phase, updated.assistant_message_id) == ("continue", "msg_1")
    current = await store.claims.current(sid)
    assert current is not None
    assert (current.phase, current.assistant_message_id, current.epoch) == ("continue", "msg_1", 1)
    await expire_claim(store, sid)
    with pytest.raises(ClaimLostError):
        await store.claims.set_phase(claim, "ready")


# --- waits on the claim row (PostgreSQL: the only database where a row lock is waited for) -----


@asynccontextmanager
async def holding_the_claim_row(store: Store, sid: str) -> AsyncIterator[int]:
    """Lock the session's claim row in another transaction while inside; yields its pid."""
    locked: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def hold() -> None:
        async with store.db.write() as tx:
            lock = "SELECT pg_backend_pid() FROM session_execution WHERE session_id = :sid"
            pid = (await tx.conn.execute(sa.text(f"{lock} FOR UPDATE"), {"sid": sid})).scalar_one()
            locked.set_result(int(pid))
            await release.wait()

    holder = asyncio.create_task(hold())
    try:
        yield await locked
    finally:
        release.set()
        await holder


async def db_now(store: Store) -> int:
    async with store.db.read() as conn:
        return int((await conn.execute(sa.select(now_ms(store.db.dialect)))).scalar_one())


async def test_a_takeover_that_waited_for_the_row_lock_gets_a_claim_that_is_live(
    postgres_target: Target,
) -> None:
    """Catalogue F3: a delayed write."""
    store = await postgres_target.open()
    try:
        sid = await new_session(store)
        await store.claims.acquire(sid, "exec_dead", "owner-a")
        await expire_claim(store, sid)
        lease = 300
        async with holding_the_claim_row(store, sid) as holder:
            taker = asyncio.create_task(
                store.claims.acquire(sid, "exec_next", "owner-b", lease_ms=lease)
            )
            await until_waiting_for(store, holder)
            await asyncio.sleep(2 * lease / 1000)  # the lock is held for longer than the lease
        claim = await asyncio.wait_for(taker, 30)
        assert claim.expires_at > await db_now(store)
        assert await rows(store, "SELECT id, expires_at FROM session_execution") == [
            ("exec_next", claim.expires_at)
        ]
    finally:
        await store.close()


async def test_an_acquire_does_not_wait_for_a_held_row_lock_beyond_its_lock_timeout(
    postgres_target: Target,
) -> None:
    store = await postgres_target.open(lease_ms=1_200)
    try:
        sid = await new_session(store)
        await store.claims.acquire(sid, "exec_a", "owner-a")
        await expire_claim(store, sid)
        async with holding_the_claim_row(store, sid):
            with pytest.raises(ClaimHeldError) as held:
                await asyncio.wait_for(store.claims.acquire(sid, "exec_b", "owner-b"), 30)
            # It gave up while the lock was still held: here, inside.
        assert held.value.execution_id == "exec_a"
        assert (await store.claims.acquire(sid, "exec_b", "owner-b")).epoch == 2
    finally:
        await store.close()


async def test_a_stalled_owner_inside_a_transaction_cannot_block_a_takeover(
    postgres_target: Target,
) -> None:
    """F3, F6: The stalled owner's idle transaction is ended by the server, well within the
    lease."""
    store = await postgres_target.open(lease_ms=1_200)
    stalled, resume = asyncio.Event(), asyncio.Event()
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")

    async def owner() -> None:
        async with store.claims.fenced(claim) as tx:
            stalled.set()
            await resume.wait()  # SIGSTOP, a blocked loop: the row lock stays taken
            await store.events.publish(ev.Synthetic(session_id=sid, text="late"), tx=tx)

    async def take_over() -> Claim:
        while True:
            try:
                return await store.claims.acquire(sid, "exec_b", "owner-b")
            except ClaimHeldError:
                await asyncio.sleep(0.05)

    owner_task = asyncio.create_task(owner())
    try:
        await stalled.wait()
        successor = await asyncio.wait_for(take_over(), 30)
        assert not owner_task.done()  # the owner is still stalled inside its transaction
        resume.set()
        with pytest.raises(StoreUnavailableError):
            await owner_task
        assert successor.epoch == claim.epoch + 1
        assert await rows(store, "SELECT seq FROM event WHERE type LIKE 'session.synthetic%'") == []
    finally:
        resume.set()
        await asyncio.gather(owner_task, return_exceptions=True)
        await store.close()


SKEWED_LEASE_MS = 1000


@pytest.mark.parametrize("skew", [-2.0, -0.5, 0.5, 2.0])
async def test_a_worker_process_on_a_skewed_clock_is_taken_over_by_the_database_clock(
    target: Target, skew: float
) -> None:
    """Catalogue F7, with two parties: worker A runs in a process of its own whose wall clock
    is ``skew`` leases off (injected there only); the test's process, B, keeps true time. A
    claims, renews and stops renewing. B's attempts are refused while the database says A's
    claim is live, whatever A's clock says, and the first one after its expiry by the
    database clock takes over with the next epoch; then A's renewal and write are refused.
    (How long the takeover took is ``bench/faults.py``'s figure, not this test's.)"""
    store = await target.open()
    try:
        sid = await new_session(store)
        ctx = procs_context()
        stopped, taken, results = ctx.Event(), ctx.Event(), ctx.Queue()
        skew_s = skew * SKEWED_LEASE_MS / 1000
        before = await db_now(store)
        a = spawn(skewed_claimant, target, sid, skew_s, SKEWED_LEASE_MS, (stopped, taken), results)
        try:
            await asyncio.to_thread(stopped.wait, 60)
            _, epoch, expires_at = results.get(timeout=10)
            # A's last renewal set its expiry by the database clock: db-now + lease.
            assert before + SKEWED_LEASE_MS <= expires_at <= await db_now(store) + SKEWED_LEASE_MS
            refused_while_live = 0
            while True:
                try:
                    successor = await store.claims.acquire(
                        sid, "exec_true", "owner-true", lease_ms=SKEWED_LEASE_MS
                    )
                    break
                except ClaimHeldError as held:
                    # A's claim, as the database set it, judged live by the database clock.
                    assert held.expires_at_ms == expires_at
                    assert held.now_ms is not None and held.now_ms <= expires_at
                    refused_while_live += 1
                    await asyncio.sleep(0.02)
            taken_at = await db_now(store)
        finally:
            taken.set()
        seen = [results.get(timeout=30), results.get(timeout=30)]
        a.join(30)
        assert a.exitcode == 0
        assert refused_while_live > 0 and taken_at > expires_at
        assert successor.epoch == epoch + 1
        assert seen == [("renew", "refused"), ("write", "refused")]
        texts = [
            e.data.text
            for e in (await store.events.read_after(sid, -1)).events
            if isinstance(e.data, ev.Synthetic)
        ]
        assert texts == ["skewed 0"]
    finally:
        await store.close()


SHORT_LEASE_MS = 300  # A's claim expires by the database clock while the test watches
_EXPIRY = "SELECT expires_at FROM session_execution WHERE session_id = :sid"


async def until_expired(store: Store, sid: str, expires_at: int) -> None:
    """Wait until the database clock has passed ``expires_at`` (a latch, not a timer)."""
    while await db_now(store) <= expires_at:
        await asyncio.sleep(0.02)


async def seqs_by_execution(store: Store, sid: str) -> list[tuple[int, str | None, int | None]]:
    query = "SELECT seq, execution_id, epoch FROM event WHERE aggregate_id = :sid ORDER BY seq"
    return [(int(s), x, e) for s, x, e in await rows(store, query, sid=sid)]


async def test_a_delayed_write_released_before_a_real_expiry_comes_before_the_takeover(
    open_test_store: StoreFactory,
) -> None:
    """Catalogue F3, order (a): A's write, paused after its fence check, is released (and
    commits) before a takeover that follows the claim's real expiry by the database clock:
    A's event is visible, B's first seq follows it, and A's next write is refused."""
    store, other = await open_test_store(), await open_test_store()
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a", lease_ms=SHORT_LEASE_MS)
    entered, release = asyncio.Event(), asyncio.Event()

    async def delayed_writer() -> int:
        async with store.claims.fenced(claim) as tx:  # the fence check renews the claim
            await store.events.publish(ev.Synthetic(session_id=sid, text="a"), tx=tx)
            (expires_at,) = (await tx.conn.execute(sa.text(_EXPIRY), {"sid": sid})).one()
            entered.set()
            await release.wait()
        return int(expires_at)

    writer = asyncio.create_task(delayed_writer())
    await entered.wait()
    release.set()
    expires_at = await writer  # committed: released before any takeover
    await until_expired(other, sid, expires_at)
    successor = await other.claims.acquire(sid, "exec_b", "owner-b")
    async with other.claims.fenced(successor) as tx:
        await other.events.publish(ev.Synthetic(session_id=sid, text="b"), tx=tx)
    with pytest.raises(ClaimLostError, match="taken over by execution exec_b"):
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="late"), tx=tx)
    stamped = [(x, e) for _s, x, e in await seqs_by_execution(store, sid) if x is not None]
    assert stamped == [("exec_a", claim.epoch), ("exec_b", claim.epoch + 1)]
    messages = await other.sessions.messages(sid)
    assert [m.text for m in messages] == ["a", "b"] and messages[0].seq < messages[1].seq


async def test_a_delayed_write_past_its_real_expiry_is_never_committed_after_the_takeover(
    open_test_store: StoreFactory,
) -> None:
    """Catalogue F3, order (b), against an expired claim on both databases: A's write passed
    its fence check, then its claim expired by the database clock while the write stayed open,
    and B's takeover (from another store, another writer connection) starts before A's write
    is released. B waits for A's transaction (SQLite's write lock, PostgreSQL's claim row
    lock): A's event commits first, and B's takeover, deciding after the wait, finds the claim
    expired, takes it over and appends after it."""
    store, other = await open_test_store(), await open_test_store()
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a", lease_ms=SHORT_LEASE_MS)
    entered, release = asyncio.Event(), asyncio.Event()
    opened: dict[str, int] = {}

    async def delayed_writer() -> None:
        async with store.claims.fenced(claim) as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="a"), tx=tx)
            (opened["expires_at"],) = (await tx.conn.execute(sa.text(_EXPIRY), {"sid": sid})).one()
            if store.db.dialect == "postgresql":
                opened["pid"] = await backend_pid(tx)
            entered.set()
            await release.wait()

    writer = asyncio.create_task(delayed_writer())
    await entered.wait()
    await until_expired(other, sid, opened["expires_at"])  # expired, A's write still open
    begun = await writer_begun(other) if store.db.dialect == "sqlite" else None
    taker = asyncio.create_task(other.claims.acquire(sid, "exec_b", "owner-b"))
    if begun is None:
        await until_waiting_for(other, opened["pid"])  # B waits for A's claim row lock
    else:
        await begun.wait()  # B's BEGIN IMMEDIATE runs: it waits for A's write lock
    assert not writer.done()
    release.set()
    await writer  # A's commit: it passed its fence while the claim was live
    successor = await asyncio.wait_for(taker, 30)
    assert successor.epoch == claim.epoch + 1
    async with other.claims.fenced(successor) as tx:
        await other.events.publish(ev.Synthetic(session_id=sid, text="b"), tx=tx)
    stamped = [(x, e) for _s, x, e in await seqs_by_execution(store, sid) if x is not None]
    assert stamped == [("exec_a", claim.epoch), ("exec_b", successor.epoch)]
    with pytest.raises(ClaimLostError, match="taken over by execution exec_b"):
        await store.claims.renew(claim)


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_hold_past_the_lease_survives_every_write_path(store: Store) -> None:
    """A claim held past its lease (``extend_until``: a permission waiting for a person) is
    never shortened by a write that renews it: the hot path's deltas, a turn's parts-only
    batch (its one statement on PostgreSQL) and the general fenced path renew to at least a
    lease from now, and leave a later expiry as it is."""
    from store.facade import TurnView

    sid = await new_session(store)
    mid = "msg_hold"
    ids = {"session_id": sid, "assistant_message_id": mid}
    claim = await store.claims.acquire(sid, "exec_a", "owner")
    hold = claim.expires_at + 3_600_000
    await store.claims.run_fenced(claim, lambda tx: store.claims.extend_until(tx, claim, hold))
    view = TurnView(mid)
    model = {"provider_id": "scripted", "id": "t.json"}
    batches: list[list[ev.Event]] = [
        [ev.StepStarted(**ids, agent="build", model=model)],  # the general path
        [ev.TextStarted(**ids, ordinal=0)],  # parts only, with the view
        [ev.TextDelta(**ids, ordinal=0, delta="x")],  # the hot path
    ]
    for batch in batches:
        await store.append(claim, batch, step_attempt=0, view=view)
        (row,) = await rows(store, "SELECT expires_at FROM session_execution")
        assert row[0] == hold, batch[0].type


async def test_a_hold_for_a_person_is_counted_from_the_database_clock(store: Store) -> None:
    """A call waiting for approval holds the claim ``hold_for`` from the database's now (it was
    the worker's clock plus the hold, wrong by the worker's skew), never shortening it."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner")
    acquired_at = claim.expires_at - claim.lease_ms  # the database's now at the acquisition
    hour = 3_600_000
    await store.claims.run_fenced(claim, lambda tx: store.claims.hold_for(tx, claim, hour))
    (row,) = await rows(store, "SELECT expires_at FROM session_execution")
    assert row[0] >= acquired_at + hour
    await store.claims.run_fenced(claim, lambda tx: store.claims.hold_for(tx, claim, 1))
    (again,) = await rows(store, "SELECT expires_at FROM session_execution")
    assert again[0] == row[0]  # a shorter hold leaves the longer one
