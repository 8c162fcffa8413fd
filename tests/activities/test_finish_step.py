"""A step's end (``SessionActivities.finish_step``): on PostgreSQL two statements, not nine.

Issue 14 item 3: on PostgreSQL every statement is a round trip. The usual end of a step reads
its message once (with its claim row's version) and writes the settlement in one fenced
statement (``Store.end_step``); it took a transaction of nine. It settles exactly as the general
path does, and whatever came between the read and the write (a fenced write, a lost claim, a
later attempt) writes nothing and leaves the step to the general path, which reads it afresh.
The store is real, on both databases.
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.runtime import Runtime, to_ref
from activities.session import SessionActivities
from activities.tools import testing as tools
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, SessionError, TextContent, Tokens
from sessionflow.models.drain import CallRef, FinishStepInput, FinishStepResult, TurnResult
from sessionflow.models.messages import AssistantMessage, ToolPart
from store import Store
from store.claims import Claim
from store.write.writes import StepSnapshot
from tests.store.helpers import round_trips, rows
from tests.store.test_projector import new_session

TOKENS = Tokens(input=100, output=20)


def _mid(sid: str) -> str:
    """The step's assistant message (ids are unique across sessions)."""
    return "msg_" + sid.removeprefix("ses_")


async def _step(store: Store) -> Claim:
    """A step as its turn and tools leave it: text, one call settled, one called but never run
    (its turn died before the workflow heard of it)."""
    sid = await new_session(store)
    claim = await store.claims.acquire(sid, f"exec_{sid}", "owner")
    mid = _mid(sid)
    ids = {"session_id": sid, "assistant_message_id": mid}
    await store.append(
        claim,
        [
            ev.StepStarted(**ids, agent="build", model=ModelRef.parse("scripted/x")),
            ev.TextStarted(**ids, ordinal=0),
            ev.TextEnded(**ids, ordinal=0, text="calling"),
            ev.ToolCalled(**ids, call_id="c1", name="read", input={"path": "a"}),
            ev.ToolCalled(**ids, call_id="c2", name="read", input={"path": "b"}),
        ],
        step_attempt=1,
    )
    await store.append(
        claim, [ev.ToolSucceeded(**ids, call_id="c1", content=[TextContent(text="A")])]
    )
    return claim


def _request(claim: Claim, **turn: Any) -> FinishStepInput:
    calls = (CallRef(call_id="c1", name="read"), CallRef(call_id="c2", name="read"))
    defaults: dict[str, Any] = {"finish": "tool-calls", "tokens": TOKENS, "cost": 0.5}
    defaults["calls"] = calls
    mid = _mid(claim.session_id)
    result = TurnResult(assistant_message_id=mid, step=1, **{**defaults, **turn})
    return FinishStepInput(claim=to_ref(claim), attempt=1, turn=result)


async def _finish(store: Store, request: FinishStepInput) -> FinishStepResult:
    activities = SessionActivities(Runtime(store, tools.testing_registry()))
    return await activities.finish_step(request)


async def _outcome(store: Store, sid: str) -> tuple[Any, ...]:
    """What a step's end leaves, without ids and clocks: the log's types, the message's
    end, its tools' states, the session's usage and the claim's phase."""
    log = (await store.events.read_after(sid)).events
    assert [e.seq for e in log] == list(range(len(log)))  # gap-free
    (message,) = [m for m in await store.sessions.messages(sid) if m.id == _mid(sid)]
    assert isinstance(message, AssistantMessage) and message.time_completed is not None
    session = await store.sessions.get(sid)
    tools_ = [
        (p.call_id, type(p.state).__name__) for p in message.content if isinstance(p, ToolPart)
    ]
    ((phase, attempt),) = await rows(
        store, "SELECT phase, step_attempt FROM session_execution WHERE session_id = :s", s=sid
    )
    return (
        [e.type for e in log],
        (message.finish, message.tokens, message.cost, message.error, message.files),
        tools_,
        (session.cost, session.tokens),
        (phase, attempt),
    )


async def test_a_step_ends_in_two_statements_on_postgresql(store: Store) -> None:
    claim = await _step(store)
    with round_trips() as sent:
        result = await _finish(store, _request(claim))
    assert result == FinishStepResult(ended=True, needs_continuation=True)
    if store.db.dialect == "postgresql":
        # the message with its claim row's version; the fenced end (it took nine)
        assert len(sent) == 2, sent
    types, end, tools_, usage, phase = await _outcome(store, claim.session_id)
    assert types[-2:] == ["session.tool.failed.1", "session.step.ended.1"]
    assert end[:3] == ("tool-calls", TOKENS, 0.5)
    assert tools_ == [("c1", "ToolCompleted"), ("c2", "ToolError")]
    assert usage == (0.5, TOKENS)
    assert phase == ("continue", 1)


async def test_the_one_statement_end_settles_as_the_general_path_does(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed and ended steps, and the user turn's end with what waits to be promoted."""
    boom = SessionError(type="provider.transport", message="reset")
    cases = [{}, {"step_failure": boom}, {"calls": (), "finish": "stop"}]
    for turn in cases:
        results = []
        for general in (False, True):
            claim = await _step(store)
            await store.inputs.admit(claim.session_id, "next", delivery="queue")
            with monkeypatch.context() as patched:
                if general:
                    patched.setattr(store, "step_snapshot", _none)
                result = await _finish(store, _request(claim, **turn))
            results.append((result, await _outcome(store, claim.session_id)))
        assert results[0] == results[1], turn
    assert results[0][0].pending is not None and results[0][0].pending.queue


async def _none(*_args: Any) -> None:
    return None


async def test_a_fenced_write_after_the_read_hands_the_end_to_the_general_path(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A late settlement (a tool's last attempt, which the workflow gave up on) commits between
    the read and the end: the end writes nothing, and the general path reads the call settled,
    so it is not failed over its result."""
    claim = await _step(store)
    read = store.step_snapshot

    async def then_settled(sid: str, mid: str) -> StepSnapshot | None:
        snapshot = await read(sid, mid)
        ids = {"session_id": sid, "assistant_message_id": mid}
        await store.append(claim, [ev.ToolSucceeded(**ids, call_id="c2", content=[])])
        return snapshot

    monkeypatch.setattr(store, "step_snapshot", then_settled)
    await _finish(store, _request(claim))
    types, _, tools_, usage, _ = await _outcome(store, claim.session_id)
    assert types.count("session.step.ended.1") == 1 and "session.tool.failed.1" not in types
    assert tools_ == [("c1", "ToolCompleted"), ("c2", "ToolCompleted")]
    assert usage == (0.5, TOKENS)  # counted once


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_refused_end_writes_nothing_not_even_its_phase(store: Store) -> None:
    """The fence refuses a stale attempt, a moved version, or events of another message: no
    event, no part, no usage, and the claim row as it was."""
    claim = await _step(store)
    sid = claim.session_id
    snapshot = await store.step_snapshot(sid, _mid(sid))
    if snapshot is None:
        assert store.db.dialect == "sqlite"  # the general path only
        return
    before = await _claim_and_log(store, sid)
    ids = {"session_id": sid, "assistant_message_id": _mid(sid)}
    ended = ev.StepEnded(**ids, finish="stop", tokens=TOKENS, cost=1.0)
    stale = await store.end_step(claim, snapshot, [ended], step_attempt=0, phase="ready")
    moved = StepSnapshot(snapshot.message, str(int(snapshot.version) + 1))
    changed = await store.end_step(claim, moved, [ended], step_attempt=1, phase="ready")
    other = ev.StepEnded(**{**ids, "assistant_message_id": "msg_other"}, finish="stop")
    elsewhere = await store.end_step(claim, snapshot, [other], step_attempt=1, phase="ready")
    assert (stale, changed, elsewhere) == (None, None, None)
    assert await _claim_and_log(store, sid) == before
    assert (await store.sessions.get(sid)).cost == 0


async def _claim_and_log(store: Store, sid: str) -> tuple[Any, ...]:
    claim = await rows(store, "SELECT * FROM session_execution WHERE session_id = :s", s=sid)
    parts = await rows(store, "SELECT data FROM session_part WHERE session_id = :s", s=sid)
    return claim, await store.events.latest_sequence(sid), parts


async def test_an_admission_after_the_read_neither_blocks_the_end_nor_leaves_a_gap(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prompt admitted between the read and the end takes the next seq (admissions hold no
    claim): the end still applies, after it, and says the prompt waits."""
    claim = await _step(store)
    read = store.step_snapshot

    async def then_admitted(sid: str, mid: str) -> StepSnapshot | None:
        snapshot = await read(sid, mid)
        await store.inputs.admit(sid, "steer me")
        return snapshot

    monkeypatch.setattr(store, "step_snapshot", then_admitted)
    result = await _finish(store, _request(claim, calls=(), finish="stop"))
    assert result.pending is not None and result.pending.steer
    types, _, _, _, phase = await _outcome(store, claim.session_id)
    assert types[-3:] == [
        "session.prompt.admitted.1",
        "session.tool.failed.1",
        "session.step.ended.1",
    ]
    assert phase == ("ready", 1)
