"""A busy period's claim (``SessionActivities.acquire_claim``): on PostgreSQL one statement for
a session without a claim row, not a transaction of nine.

Issue 14 item 3. The claim at the epoch after the session's last, its ``execution.started`` and
the session's epoch are written by one statement (``Store.claim_at_once``); a live claim, an
expired one to take over, this execution's own claim or a started event already written leave
it to the general path (``Claims.acquire_with``), which writes nothing twice and says who holds
the session. The store is real, on both databases.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from temporalio.exceptions import ApplicationError

from activities.runtime import Runtime, to_claim
from activities.session import SessionActivities
from activities.tools import testing as tools
from sessionflow.errors import ClaimHeldError
from sessionflow.models import events as ev
from sessionflow.models.drain import AcquireInput, ClaimRef
from store import Store
from tests.conftest import Target
from tests.faults import answer_lost
from tests.store.helpers import round_trips, rows
from tests.store.test_projector import new_session


async def _acquire(store: Store, sid: str, name: str) -> ClaimRef:
    """Claim ``sid`` for the execution ``name`` of it (execution ids, like the run ids they
    are, are unique across sessions: the started event's id is made of it)."""
    execution = _execution(sid, name)
    activities = SessionActivities(Runtime(store, tools.testing_registry()))
    request = AcquireInput(session_id=sid, execution_id=execution, owner_id=f"wf/{execution}")
    return await activities.acquire_claim(request)


def _execution(sid: str, name: str) -> str:
    return f"{name}_{sid}"


async def _state(store: Store, sid: str) -> tuple[Any, ...]:
    """The log (type, execution, epoch), the claim row (execution, epoch, phase) and the
    session's last epoch."""
    log = (await store.events.read_after(sid)).events
    assert [e.seq for e in log] == list(range(len(log)))  # gap-free
    claim = await rows(
        store, "SELECT id, epoch, phase FROM session_execution WHERE session_id = :s", s=sid
    )
    (epoch,) = await rows(store, "SELECT claim_epoch FROM session WHERE id = :s", s=sid)
    return [(e.type, e.execution_id, e.epoch) for e in log], claim, epoch[0]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_first_claim_is_one_statement_on_postgresql(store: Store) -> None:
    sid = await new_session(store)
    with round_trips() as sent:
        ref = await _acquire(store, sid, "exec_a")
    if store.db.dialect == "postgresql":
        assert len(sent) == 1, sent  # it took nine
    assert (ref.execution_id, ref.epoch) == (_execution(sid, "exec_a"), 1)
    log, claim, epoch = await _state(store, sid)
    assert log[-1] == ("session.execution.started.1", _execution(sid, "exec_a"), 1)
    assert claim == [(_execution(sid, "exec_a"), 1, "ready")] and epoch == 1
    # released, the next busy period's claim is at the next epoch, in one statement again
    await store.claims.release(to_claim(ref))
    with round_trips() as sent:
        ref = await _acquire(store, sid, "exec_b")
    assert ref.epoch == 2 and len(sent) == (1 if store.db.dialect == "postgresql" else 0)
    log, claim, epoch = await _state(store, sid)
    assert log[-1] == ("session.execution.started.1", _execution(sid, "exec_b"), 2)
    assert claim == [(_execution(sid, "exec_b"), 2, "ready")] and epoch == 2


@pytest.mark.unsettled  # it ends inside a busy period
async def test_the_one_statement_claim_claims_as_the_general_path_does(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = []
    for general in (False, True):
        sid = await new_session(store)
        with monkeypatch.context() as patched:
            if general:
                patched.setattr(store, "claim_at_once", _not_written)
            first = await _acquire(store, sid, "exec_a")
            await store.claims.release(to_claim(first))
            second = await _acquire(store, sid, "exec_b")
        log, claim, epoch = await _state(store, sid)
        named = [(t, x.removesuffix(f"_{sid}") if x else x, e) for t, x, e in log]
        results.append(((first.epoch, second.epoch), named, [c[1:] for c in claim], epoch))
    assert results[0] == results[1]
    assert results[0][0] == (1, 2)


async def _not_written(*_args: Any, **_kwargs: Any) -> None:
    return None


async def test_a_claim_whose_answer_was_lost_is_taken_again_without_a_second_start(
    postgres_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C2 (PostgreSQL, where the injector reaches the commit): the one-statement claim commits
    and its answer is lost (the activity fails); the retried activity finds its own claim (the
    general path renews it) and writes no second ``execution.started``."""
    store = await postgres_target.open()
    try:
        sid = await new_session(store)
        started = ev.ExecutionStarted.stored_type()
        async with answer_lost(store, monkeypatch, started) as faults:
            with pytest.raises(ApplicationError, match="StoreUnavailableError"):
                await _acquire(store, sid, "exec_a")
            assert faults.seen == {f"commit_then_fail:{started}": 1}
            again = await _acquire(store, sid, "exec_a")
        log, claim, epoch = await _state(store, sid)
    finally:
        await store.close()
    assert (again.execution_id, again.epoch) == (_execution(sid, "exec_a"), 1)
    assert [t for t, *_ in log].count("session.execution.started.1") == 1
    assert claim == [(_execution(sid, "exec_a"), 1, "ready")] and epoch == 1


@pytest.mark.breaks_invariants("I5")  # released with no execution terminal
async def test_a_started_event_already_written_takes_the_general_path(store: Store) -> None:
    """No claim row, but the execution's ``execution.started`` exists (it claimed and
    released): the one statement writes nothing, rather than fail on the event's id."""
    sid = await new_session(store)
    first = await _acquire(store, sid, "exec_a")
    await store.claims.release(to_claim(first))
    before = await _state(store, sid)
    execution = _execution(sid, "exec_a")
    started = ev.ExecutionStarted(session_id=sid, execution_id=execution)
    event_id = f"evt_{execution}_started"
    assert await store.claim_at_once(sid, execution, "wf/a", [(started, event_id)]) is None
    assert await _state(store, sid) == before


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_live_claim_of_another_is_held_and_nothing_is_written(store: Store) -> None:
    sid = await new_session(store)
    await _acquire(store, sid, "exec_a")
    before = await _state(store, sid)
    other = _execution(sid, "exec_b")
    started = ev.ExecutionStarted(session_id=sid, execution_id=other)
    assert await store.claim_at_once(sid, other, "wf/b", [(started, f"evt_{other}")]) is None
    with pytest.raises(ApplicationError) as raised:
        await _acquire(store, sid, "exec_b")
    assert raised.value.type == ClaimHeldError.__name__
    assert await _state(store, sid) == before


@pytest.mark.unsettled  # it ends inside a busy period
async def test_two_acquirers_racing_get_one_claim(store: Store) -> None:
    """Two executions claim the session at once: one gets it, the other is told it is held;
    one ``execution.started``, at epoch 1."""
    sid = await new_session(store)
    outcomes = await asyncio.gather(
        *(_acquire(store, sid, f"exec_{n}") for n in range(4)), return_exceptions=True
    )
    won = [o for o in outcomes if isinstance(o, ClaimRef)]
    lost = [o for o in outcomes if not isinstance(o, ClaimRef)]
    assert len(won) == 1 and won[0].epoch == 1, outcomes
    assert all(isinstance(o, ApplicationError) and o.type == "ClaimHeldError" for o in lost)
    log, claim, epoch = await _state(store, sid)
    assert [t for t, *_ in log].count("session.execution.started.1") == 1
    assert claim == [(won[0].execution_id, 1, "ready")] and epoch == 1


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_claim_row_being_written_sends_the_claim_to_the_general_path_at_once(
    store: Store,
) -> None:
    """The holder's transaction is renewing its claim row, not yet committed: the one-statement
    claim answers "not here" while that transaction is still open (it never waits on the row;
    the general path waits, bounded by its lock timeout, and says who holds the session)."""
    sid = await new_session(store)
    await _acquire(store, sid, "exec_a")
    if store.db.dialect != "postgresql":
        return  # SQLite claims in the general path only
    other = _execution(sid, "exec_b")
    started = ev.ExecutionStarted(session_id=sid, execution_id=other)
    async with await psycopg.AsyncConnection.connect(store.db.psycopg_conninfo) as holder:
        await holder.execute(
            "UPDATE session_execution SET expires_at = expires_at + 1 WHERE session_id = %s",
            [sid],
        )
        attempt = asyncio.ensure_future(
            store.claim_at_once(sid, other, "wf/b", [(started, f"evt_{other}")])
        )
        # A bound for a hung test, not a threshold: the answer must come while the row is held.
        done, _ = await asyncio.wait([attempt], timeout=60)
        assert done, "the claim waited on the holder's row"
        assert attempt.result() is None
        assert holder.info.transaction_status == TransactionStatus.INTRANS  # still held
        await holder.rollback()
    log, claim, _ = await _state(store, sid)
    assert claim == [(_execution(sid, "exec_a"), 1, "ready")]
    assert [t for t, *_ in log].count("session.execution.started.1") == 1
