"""The invariant checker catches each broken invariant (negative controls on hand-made logs)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef
from store import Store
from store.events import StoredEvent
from tests.invariants import UNSETTLED, check_store, violations

SID = "ses_checker"
MSG = "msg_a"
MODEL = ModelRef(provider_id="scripted", id="m.json")
Log = list[StoredEvent]


def _log(*events: ev.Event, stamp: tuple[str, int] | None = ("exec_1", 1)) -> Log:
    stored = []
    for seq, event in enumerate(events):
        unstamped = event.type in ("session.created", "session.prompt.admitted")
        execution, epoch = (None, None) if unstamped or stamp is None else stamp
        stored.append(StoredEvent(f"evt_{seq}", SID, seq, seq, event.type, event, execution, epoch))
    return stored


def _clean() -> Log:
    ids = {"session_id": SID, "assistant_message_id": MSG}
    return _log(
        ev.SessionCreated(session_id=SID, directory="/w"),
        ev.ExecutionStarted(session_id=SID, execution_id="exec_1"),
        ev.StepStarted(**ids, agent="build", model=MODEL),
        ev.ToolCalled(**ids, call_id="c1", name="echo", input={}),
        ev.ToolSucceeded(**ids, call_id="c1"),
        ev.StepEnded(**ids, finish="tool-calls"),
        ev.ExecutionSucceeded(session_id=SID, execution_id="exec_1"),
    )


def test_a_clean_log_passes() -> None:
    assert violations(_clean()) == []


def _gap(log: Log) -> Log:
    return [*log[:2], *(_with(e, seq=e.seq + 1) for e in log[2:])]


def _result_before_call(log: Log) -> Log:
    log[3], log[4] = log[4], log[3]
    return _renumbered(log)


def _second_result(log: Log) -> Log:
    return _renumbered([*log[:5], log[4], *log[5:]])


def _result_after_the_step(log: Log) -> Log:
    return _renumbered([*log[:4], log[5], log[4], log[6]])


def _unstamped_write(log: Log) -> Log:
    log[4] = _with(log[4], execution_id=None, epoch=None)
    return log


def _older_epoch_after_a_newer(log: Log) -> Log:
    log[3] = _with(log[3], execution_id="exec_2", epoch=2)
    return log


def _step_without_terminal(log: Log) -> Log:
    return _renumbered([*log[:5], log[6]])


def _two_execution_terminals(log: Log) -> Log:
    return _renumbered([*log, log[6]])


def _second_call(log: Log) -> Log:
    return _renumbered([*log[:4], log[3], *log[4:]])


def _call_never_settled(log: Log) -> Log:
    return _renumbered([*log[:4], *log[5:]])


def _two_executions_at_one_epoch(log: Log) -> Log:
    log[2] = _with(log[2], execution_id="exec_2", epoch=1)
    return log


def _no_creation(log: Log) -> Log:
    return _renumbered(log[1:])


def _with(event: StoredEvent, **fields: object) -> StoredEvent:
    values = {**event.__dict__, **fields}
    return StoredEvent(**values)  # type: ignore[arg-type]


def _renumbered(log: Log) -> Log:
    return [_with(e, seq=i) for i, e in enumerate(log)]


@pytest.mark.parametrize(
    ("invariant", "breaks"),
    [
        ("I1", _gap),
        ("I2", _result_before_call),
        ("I3", _second_result),
        ("I3", _result_after_the_step),
        ("I4", _unstamped_write),
        ("I4", _older_epoch_after_a_newer),
        ("I5", _step_without_terminal),
        ("I5", _two_execution_terminals),
        ("I6", _second_call),
        ("I6", _call_never_settled),
        ("I7", _two_executions_at_one_epoch),
        ("I8", _no_creation),
    ],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_each_broken_invariant_is_reported(invariant: str, breaks: Callable[[Log], Log]) -> None:
    found = violations(breaks(_clean()))
    assert found and {problem.split(":")[0] for problem in found} == {invariant}, found


def test_a_log_still_claimed_may_lack_terminals_but_never_have_extra_ones() -> None:
    unfinished = _clean()[:4]
    assert violations(unfinished, final=False) == []
    assert violations(unfinished, final=True) != []
    doubled = _two_execution_terminals(_clean())
    assert violations(doubled, final=False) != []


async def test_projections_that_differ_from_a_rebuild_are_reported(store: Store) -> None:
    """I9: the store's projections are compared with a rebuild from the events alone. (The
    prompt is promoted under no claim, which I4 and I5 would report: they are not this
    test's.)"""
    others = {"I4", "I5"}
    sid = (await store.sessions.create("/w")).id
    receipt = await store.inputs.admit(sid, "Hello")
    await store.events.publish(ev.PromptPromoted(session_id=sid, input_id=receipt.id))
    assert await store.sessions.messages(sid)
    await check_store(store, allowed=others)  # the projection is what the events make
    async with store.db.write() as tx:
        await tx.conn.execute(
            sa.text("UPDATE session_message SET data = replace(data, 'Hello', 'Tampered')")
        )
    with pytest.raises(AssertionError, match=f"I9: {sid}'s messages differ from a rebuild"):
        await check_store(store, allowed=others)
    await check_store(store, allowed={"I9", *others})


async def test_a_claimed_sessions_missing_terminals_fail_the_store_check(store: Store) -> None:
    """The store check is strict for a claimed session too: a busy period left open (a step
    never ended) fails it, unless the test says it ends mid busy period (``UNSETTLED``)."""
    sid = (await store.sessions.create("/w")).id
    claim = await store.claims.acquire(sid, "exec_1", "owner")
    ids = {"session_id": sid, "assistant_message_id": MSG}
    await store.append(
        claim,
        [
            ev.ExecutionStarted(session_id=sid, execution_id="exec_1"),
            ev.StepStarted(**ids, agent="build", model=MODEL),
        ],
    )
    assert await store.claims.current(sid) is not None
    with pytest.raises(AssertionError, match=f"{sid}: I5: step {MSG} has 0 terminal events"):
        await check_store(store)
    await check_store(store, allowed={UNSETTLED})
