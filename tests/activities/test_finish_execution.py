"""A busy period's end (``SessionActivities.finish_execution``): on PostgreSQL two statements,
not nine.

Issue 14 item 3. The terminal event, the session's recoveries forgotten and the claim released
(or kept) were a fenced transaction of nine round trips; now the claim row's version, the latest
assistant message and whether the terminal exists are read in one statement, and the rest is
one statement fenced on that version (``Store.end_execution``). It ends exactly as the general
path does; a pending retry (which the terminal's projection ends), a terminal already written,
a fenced write between the read and the write, or a lost claim leave it to the general path.
The store is real, on both databases.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.runtime import Runtime, to_ref
from activities.session import SessionActivities
from activities.tools import testing as tools
from sessionflow.errors import ClaimLostError
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, SessionError
from sessionflow.models.drain import FinishExecutionInput, Outcome
from sessionflow.models.messages import AssistantMessage
from store import Store
from store.claims import Claim
from store.write.fast import PostgresWriter
from tests.conftest import Target
from tests.faults import answer_lost
from tests.store.helpers import round_trips, rows
from tests.store.test_projector import new_session

OUTCOMES = [
    Outcome(type="succeeded"),
    Outcome(type="failed", error=SessionError(type="provider.auth", message="bad key")),
    Outcome(type="interrupted", reason="user"),
]


async def _busy(store: Store, *, retrying: bool = False, recovered: bool = False) -> Claim:
    """A busy period with one step; ``retrying``: its message announces a retry;
    ``recovered``: it took the session over from a dead execution (a recovery row)."""
    sid = await new_session(store)
    if recovered:
        await store.claims.acquire(sid, f"dead_{sid}", "owner", lease_ms=1)
        await asyncio.sleep(0.01)  # the database's clock passes the dead claim's expiry
    claim = await store.claims.acquire(sid, f"exec_{sid}", "owner")
    mid = "msg_" + sid.removeprefix("ses_")
    ids = {"session_id": sid, "assistant_message_id": mid}
    events: list[ev.Event] = [
        ev.StepStarted(**ids, agent="build", model=ModelRef.parse("scripted/x"))
    ]
    if retrying:
        error = SessionError(type="provider.rate-limit", message="busy")
        events.append(ev.RetryScheduled(**ids, attempt=1, at=0, error=error))
    await store.append(claim, events, step_attempt=1)
    return claim


async def _finish(store: Store, claim: Claim, outcome: Outcome, keep: bool = False) -> None:
    activities = SessionActivities(Runtime(store, tools.testing_registry()))
    request = FinishExecutionInput(claim=to_ref(claim), outcome=outcome, keep_claim=keep)
    await activities.finish_execution(request)


async def _outcome(store: Store, claim: Claim) -> tuple[Any, ...]:
    """What a busy period's end leaves, without ids and clocks: the log's types and its last
    event, whether that is stamped with ``claim``, the claim (owner, epoch) if kept, the
    recoveries, the latest message's retry."""
    sid = claim.session_id
    log = (await store.events.read_after(sid)).events
    assert [e.seq for e in log] == list(range(len(log)))  # gap-free
    kept = await rows(
        store, "SELECT owner_id, epoch FROM session_execution WHERE session_id = :s", s=sid
    )
    recoveries = await rows(store, "SELECT * FROM session_recovery WHERE session_id = :s", s=sid)
    (message,) = [m for m in await store.sessions.messages(sid) if isinstance(m, AssistantMessage)]
    terminal = log[-1]
    return (
        [e.type for e in log],
        terminal.data.model_dump(exclude={"session_id", "execution_id"}),
        (terminal.execution_id, terminal.epoch) == (claim.execution_id, claim.epoch),
        kept,
        len(recoveries),
        message.retry,
    )


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_busy_period_ends_in_two_statements_on_postgresql(store: Store) -> None:
    claim = await _busy(store, recovered=True)
    sid = claim.session_id
    assert len(await rows(store, "SELECT 1 FROM session_recovery WHERE session_id = :s", s=sid))
    with round_trips() as sent:
        await _finish(store, claim, Outcome(type="succeeded"))
    if store.db.dialect == "postgresql":
        # the claim row's version with what decides the path; the fenced end (it took nine)
        assert len(sent) == 2, sent
    types, _, stamp, kept, recoveries, _ = await _outcome(store, claim)
    assert types[-1] == "session.execution.succeeded.1"
    assert types.count("session.execution.succeeded.1") == 1
    assert stamp
    assert (kept, recoveries) == ([], 0)  # released, and the recoveries forgotten with it
    again = await store.claims.acquire(sid, "exec_next", "owner")
    assert again.epoch == claim.epoch + 1


@pytest.mark.breaks_invariants("I5")  # its busy periods end a step never ended
async def test_the_two_statement_end_ends_as_the_general_path_does(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every outcome, released or kept, and a retry the terminal ends (the general path)."""
    cases = [(o, keep, False) for o in OUTCOMES for keep in (False, True)]
    cases.append((OUTCOMES[0], False, True))
    for outcome, keep, retrying in cases:
        results = []
        for general in (False, True):
            claim = await _busy(store, retrying=retrying, recovered=True)
            with monkeypatch.context() as patched:
                if general:
                    patched.setattr(store, "end_execution", _not_written)
                await _finish(store, claim, outcome, keep)
            results.append(await _outcome(store, claim))
        assert results[0] == results[1], (outcome, keep, retrying)
        kept = results[0][3]
        assert len(kept) == (1 if keep else 0) and results[0][2]
        assert results[0][5] is None  # a retry the busy period announced is over


async def _not_written(*_args: Any, **_kwargs: Any) -> bool:
    return False


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_pending_retry_or_a_written_terminal_takes_the_general_path(
    store: Store,
) -> None:
    """The fast path writes only the terminal of a busy period with no retry to end and no
    terminal yet; otherwise it writes nothing (and the general path does the rest)."""
    retrying = await _busy(store, retrying=True)
    succeeded = ev.ExecutionSucceeded(
        session_id=retrying.session_id, execution_id=retrying.execution_id
    )
    tid = f"evt_{retrying.execution_id}_succeeded"
    before = await store.events.latest_sequence(retrying.session_id)
    assert not await store.end_execution(retrying, succeeded, tid, release=True)
    assert await store.events.latest_sequence(retrying.session_id) == before
    plain = await _busy(store)
    done = ev.ExecutionSucceeded(session_id=plain.session_id, execution_id=plain.execution_id)
    tid = f"evt_{plain.execution_id}_succeeded"
    first = await store.end_execution(plain, done, tid, release=False)
    assert first == (store.db.dialect == "postgresql")
    if first:  # kept: a second end finds the terminal there and writes nothing
        assert not await store.end_execution(plain, done, tid, release=True)
        types = [e.type for e in (await store.events.read_after(plain.session_id)).events]
        assert types.count("session.execution.succeeded.1") == 1


@pytest.mark.breaks_invariants("I5")  # its busy periods end a step never ended
async def test_a_fenced_write_after_the_read_hands_the_end_to_the_general_path(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of the busy period commits between the read and the end: a retry announced on
    the step's message, which moves the claim row's version. The one statement writes nothing,
    and the general path ends the busy period once, ending the retry with it."""
    claim = await _busy(store)
    sid = claim.session_id
    if store.db.dialect != "postgresql":  # SQLite ends inline, in the general path only
        done = ev.ExecutionSucceeded(session_id=sid, execution_id=claim.execution_id)
        assert not await store.end_execution(claim, done, "evt_x", release=True)
        return
    writer = store.writer
    assert isinstance(writer, PostgresWriter)
    read, end = writer.read_execution, writer.end_execution
    ended: list[bool] = []

    async def then_retrying(session_id: str, terminal_id: str) -> list[tuple[Any, ...]]:
        row = await read(session_id, terminal_id)
        ids = {"session_id": sid, "assistant_message_id": "msg_" + sid.removeprefix("ses_")}
        error = SessionError(type="provider.rate-limit", message="busy")
        retry = ev.RetryScheduled(**ids, attempt=1, at=0, error=error)
        await store.append(claim, [retry], step_attempt=1)
        return row

    async def spied(*args: Any, **kwargs: Any) -> bool:
        ended.append(await end(*args, **kwargs))
        return ended[-1]

    monkeypatch.setattr(writer, "read_execution", then_retrying)
    monkeypatch.setattr(writer, "end_execution", spied)
    await _finish(store, claim, Outcome(type="succeeded"))
    assert ended == [False]  # the version moved: the one statement wrote nothing
    types, _, _, kept, _, retry = await _outcome(store, claim)
    assert types[-2:] == ["session.retry.scheduled.1", "session.execution.succeeded.1"]
    assert types.count("session.execution.succeeded.1") == 1 and kept == [] and retry is None


@pytest.mark.parametrize("keep", [False, True])
async def test_an_end_whose_answer_was_lost_is_not_written_twice(
    postgres_target: Target, monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """C2 (PostgreSQL, where the injector reaches the commit): the end commits and its answer
    is lost (the activity fails); the retried activity finds its terminal written (released:
    the claim gone; kept: the terminal there) and succeeds without a second."""
    store = await postgres_target.open()
    try:
        claim = await _busy(store)
        terminal = ev.ExecutionSucceeded.stored_type()
        async with answer_lost(store, monkeypatch, terminal) as faults:
            with pytest.raises(ApplicationError, match="StoreUnavailableError"):
                await _finish(store, claim, Outcome(type="succeeded"), keep)
            assert faults.seen == {f"commit_then_fail:{terminal}": 1}
            await _finish(store, claim, Outcome(type="succeeded"), keep)
        types, _, stamp, kept, _, _ = await _outcome(store, claim)
    finally:
        await store.close()
    assert types.count("session.execution.succeeded.1") == 1 and stamp
    assert len(kept) == int(keep)


async def test_a_late_end_of_a_superseded_execution_leaves_the_recovery_alone(
    store: Store,
) -> None:
    """The execution died, another took the session over (recording a recovery for it), then
    the dead one's end arrives late: it writes nothing, and the recovery its successor must
    run is still there."""
    sid = await new_session(store)
    dead = await store.claims.acquire(sid, f"dead_{sid}", "owner", lease_ms=1)
    await asyncio.sleep(0.01)  # the database's clock passes the dead claim's expiry
    await store.claims.acquire(sid, f"exec_{sid}", "owner")
    recovery = "SELECT execution_id FROM session_recovery WHERE session_id = :s"
    assert await rows(store, recovery, s=sid) == [(dead.execution_id,)]
    before = await store.events.latest_sequence(sid)
    done = ev.ExecutionSucceeded(session_id=sid, execution_id=dead.execution_id)
    tid = f"evt_{dead.execution_id}_succeeded"
    assert not await store.end_execution(dead, done, tid, release=True)
    with pytest.raises(ApplicationError) as raised:
        await _finish(store, dead, Outcome(type="succeeded"))
    assert raised.value.type == ClaimLostError.__name__
    assert await rows(store, recovery, s=sid) == [(dead.execution_id,)]
    assert await store.events.latest_sequence(sid) == before


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_lost_claim_ends_nothing(store: Store) -> None:
    """Another execution took the session over: the end writes nothing and says why."""
    claim = await _busy(store)
    sid = claim.session_id
    await store.claims.release(claim)
    await store.claims.acquire(sid, "exec_other", "owner")
    before = await store.events.latest_sequence(sid)
    with pytest.raises(ApplicationError) as raised:
        await _finish(store, claim, Outcome(type="succeeded"))
    assert raised.value.type == ClaimLostError.__name__ and raised.value.non_retryable
    assert await store.events.latest_sequence(sid) == before
