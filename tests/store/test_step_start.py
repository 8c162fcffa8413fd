"""A turn's first batch, which starts its step: one statement on PostgreSQL (``_PG_START``).

Issue 14 item 3: on PostgreSQL every statement is a round trip, and the batch that starts a
step took a fenced transaction of seven or eight. The turn's opening reads what the step would
start on (``StepBasis``: the log's last seq, whether the message exists, the latest assistant
message); the first batch builds the message and writes it, its parts and its events in one
statement while the log has not moved. Anything else takes the general path, which reads and
decides again: the same message, the same log. On SQLite the general path runs inline and the
basis goes unused. Real store, both databases.
"""

from __future__ import annotations

from typing import Any

import pytest

from sessionflow.errors import StaleAttemptError
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef
from sessionflow.models.messages import AssistantMessage
from store import Store
from store.claims import Claim
from store.facade import TurnView
from store.sessions import StepBasis
from tests.store.helpers import round_trips
from tests.store.test_projector import new_session, start_step


async def _claimed(store: Store) -> Claim:
    sid = await new_session(store)
    return await store.claims.acquire(sid, f"exec_{sid}", "owner")


def _mid(claim: Claim, step: int = 1) -> str:
    return f"msg_{step}_" + claim.session_id.removeprefix("ses_")


async def _basis(store: Store, claim: Claim, mid: str) -> StepBasis:
    """What the turn's opening reads (``TurnActivities._begin``), in a transaction."""
    async with store.db.write() as tx:
        _, _, basis = await store.sessions.opening(tx, claim.session_id, mid)
    return basis


def _first(claim: Claim, mid: str) -> list[ev.Event]:
    """A first batch: the step's start, text, and a call made at once."""
    ids = {"session_id": claim.session_id, "assistant_message_id": mid}
    return [
        ev.StepStarted(**ids, agent="build", model=ModelRef.parse("scripted/t.json")),
        ev.TextStarted(**ids, ordinal=0),
        ev.TextDelta(**ids, ordinal=0, delta="hi"),
        ev.ToolInputStarted(**ids, call_id="c1", name="read"),
        ev.ToolCalled(**ids, call_id="c1", name="read", input={"n": 1}),
    ]


async def _left(store: Store, claim: Claim, mid: str) -> tuple[Any, ...]:
    """The log (gap-free) and the step's message, without ids and clocks."""
    log = (await store.events.read_after(claim.session_id)).events
    assert [e.seq for e in log] == list(range(len(log)))
    (message,) = [m for m in await store.sessions.messages(claim.session_id) if m.id == mid]
    assert isinstance(message, AssistantMessage)
    starts = [e for e in log if isinstance(e.data, ev.StepStarted)]
    started = next(e for e in starts if e.data.assistant_message_id == mid)  # a retry's first
    assert (message.seq, message.time_created) == (started.seq, started.created)
    times = {"time", "time_created", "time_completed"}
    parts = [p.model_dump(exclude=times) for p in message.content]
    row = message.model_dump(exclude={"id", "session_id", "content", *times})
    return [e.type for e in log], row, parts


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_first_batch_starts_its_step_in_one_statement(store: Store) -> None:
    results = []
    for basis_read in (False, True):
        claim = await _claimed(store)
        mid = _mid(claim)
        view = TurnView(mid, basis=await _basis(store, claim, mid) if basis_read else None)
        with round_trips() as sent:
            await store.append(claim, _first(claim, mid), step_attempt=1, view=view)
        if basis_read and store.db.dialect == "postgresql":
            assert len(sent) == 1, sent  # it took a transaction of eight
            assert view.message is not None and view.basis is None  # the next batch's view
        results.append(await _left(store, claim, mid))
    assert results[0] == results[1]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_log_that_moved_since_the_opening_takes_the_general_path(store: Store) -> None:
    """A prompt admitted after the opening read (admissions hold no claim) moves the log: the
    start writes nothing (but the renewal) and the general path starts the step after it."""
    claim = await _claimed(store)
    mid = _mid(claim)
    view = TurnView(mid, basis=await _basis(store, claim, mid))
    await store.inputs.admit(claim.session_id, "meanwhile")
    await store.append(claim, _first(claim, mid), step_attempt=1, view=view)
    types, message, parts = await _left(store, claim, mid)
    assert types[1:3] == ["session.prompt.admitted.1", "session.step.started.1"]
    assert [p["type"] for p in parts] == ["text", "tool"]
    assert message["seq"] == 2


@pytest.mark.breaks_invariants("I4")  # the incomplete step starts unclaimed
@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_step_that_supersedes_an_incomplete_one_takes_the_general_path(
    store: Store,
) -> None:
    """The opening found the latest assistant message incomplete (a step that never ended):
    the general path starts the new step and completes the old one, as it always did."""
    claim = await _claimed(store)
    old = await start_step(store, claim.session_id, _mid(claim, 0))
    mid = _mid(claim)
    view = TurnView(mid, basis=await _basis(store, claim, mid))
    assert view.basis is not None and view.basis.latest is not None
    await store.append(claim, _first(claim, mid), step_attempt=1, view=view)
    messages = {m.id: m for m in await store.sessions.messages(claim.session_id)}
    completed = messages[old]
    assert isinstance(completed, AssistantMessage) and completed.time_completed is not None
    await _left(store, claim, mid)


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_retried_turn_re_announcing_its_step_takes_the_general_path(
    store: Store,
) -> None:
    claim = await _claimed(store)
    mid = _mid(claim)
    await store.append(claim, _first(claim, mid)[:1], step_attempt=1)
    view = TurnView(mid, basis=await _basis(store, claim, mid))
    assert view.basis is not None and view.basis.exists
    await store.append(claim, _first(claim, mid), step_attempt=2, view=view)
    types, _, parts = await _left(store, claim, mid)
    assert types.count("session.step.started.1") == 2 and len(parts) == 2


async def test_a_start_the_fence_refuses_writes_nothing(store: Store) -> None:
    """A later attempt of the step took over: the start of the older one is refused whole
    (no event, no message, no part) and raises as the general path does."""
    claim = await _claimed(store)
    mid = _mid(claim)
    view = TurnView(mid, basis=await _basis(store, claim, mid))
    ids = {"session_id": claim.session_id, "assistant_message_id": "msg_other"}
    await store.append(claim, [ev.TextDelta(**ids, ordinal=0, delta="x")], step_attempt=2)
    before = await store.events.latest_sequence(claim.session_id)
    with pytest.raises(StaleAttemptError):
        await store.append(claim, _first(claim, mid), step_attempt=1, view=view)
    assert await store.events.latest_sequence(claim.session_id) == before
    assert not [m for m in await store.sessions.messages(claim.session_id) if m.id == mid]
