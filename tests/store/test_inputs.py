"""Input admission and promotion (reference §1.5, §4.1, §4.2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa

from sessionflow.errors import (
    AdmissionUnavailableError,
    InputConflictError,
    InvalidIdError,
    LifecycleConflictError,
    SessionNotFoundError,
    UnencodableTextError,
)
from sessionflow.ids import message_id
from sessionflow.models import events as ev
from sessionflow.models.common import FileAttachment, ModelRef, Prompt, SessionError
from sessionflow.models.messages import CompactionMessage, UserMessage
from store import Store
from store.db import Tx
from store.events import StoredEvent
from store.inputs import ADMIT_ATTEMPTS
from tests.store.helpers import count, statements

PROMOTED = "session.prompt.promoted.1"
ADMITTED = "session.prompt.admitted.1"


async def new_session(store: Store) -> str:
    return (await store.sessions.create("/work")).id


async def events_of(store: Store, sid: str, type: str | None = None) -> list[StoredEvent]:
    events = (await store.events.read_after(sid)).events
    return [e for e in events if type is None or e.type == type]


async def promote_steers(store: Store, sid: str) -> int:
    async with store.db.write() as tx:
        return await store.inputs.promote_steers(tx, sid)


async def promote_next_queued(store: Store, sid: str) -> bool:
    async with store.db.write() as tx:
        return await store.inputs.promote_next_queued(tx, sid)


async def user_messages(store: Store, sid: str) -> list[UserMessage]:
    return [m for m in await store.sessions.messages(sid) if isinstance(m, UserMessage)]


async def written(store: Store) -> tuple[int, int]:
    return await count(store, "event"), await count(store, "session_input")


# --- admission ----------------------------------------------------------------------------------


async def test_admit_records_the_input_and_its_event(store: Store) -> None:
    sid = await new_session(store)
    receipt = await store.inputs.admit(sid, "hello", input_id="msg_in1")
    assert receipt.id == "msg_in1"
    assert receipt.session_id == sid
    assert receipt.type == "prompt"
    assert receipt.prompt == Prompt(text="hello")
    assert receipt.delivery == "steer"
    assert receipt.promoted_seq is None
    (admitted,) = await events_of(store, sid, ADMITTED)
    assert receipt.admitted_seq == admitted.seq == 1
    assert receipt.time_created == admitted.created
    assert admitted.data == ev.PromptAdmitted(
        session_id=sid, input_id="msg_in1", prompt=Prompt(text="hello"), delivery="steer"
    )
    assert await store.inputs.get("msg_in1") == receipt
    assert await store.inputs.pending(sid) == [receipt]


async def test_admit_generates_an_input_id(store: Store) -> None:
    sid = await new_session(store)
    one = await store.inputs.admit(sid, "a")
    two = await store.inputs.admit(sid, "a")
    assert one.id.startswith("msg_")
    assert one.id != two.id
    assert await count(store, "session_input") == 2
    # The receipt of a fresh admission is the stored input, as a later read returns it.
    assert [await store.inputs.get(r.id) for r in (one, two)] == [one, two]


class Faults:
    """The database failing admissions (a projector of the test's own, in their transaction):
    ``lost_acks`` commits that then raise, ``aborts`` transactions that raise before commit."""

    def __init__(self, store: Store) -> None:
        self.lost_acks = 0
        self.aborts = 0
        self.admitted: list[str] = []
        store.events.project(ev.PromptAdmitted, self._inject)

    async def _inject(self, tx: Tx, stored: StoredEvent) -> None:
        if self.aborts:
            self.aborts -= 1
            raise _connection_lost()
        self.admitted.append(stored.data.input_id)
        if self.lost_acks:
            self.lost_acks -= 1
            tx.after_commit.insert(0, _raise_connection_lost)


def _connection_lost() -> sa.exc.OperationalError:
    return sa.exc.OperationalError("COMMIT", None, ConnectionResetError("connection lost"))


def _raise_connection_lost() -> None:
    raise _connection_lost()


async def test_a_fresh_admission_whose_acknowledgement_was_lost_is_admitted_once(
    store: Store,
) -> None:
    """Catalogue C2: an ambiguous commit."""
    sid = await new_session(store)
    faults = Faults(store)
    faults.lost_acks = 1
    receipt = await store.inputs.admit(sid, "hello")
    assert faults.lost_acks == 0, "the acknowledgement was never lost"
    assert faults.admitted == [receipt.id]
    assert await written(store) == (2, 1)
    assert await store.inputs.get(receipt.id) == receipt


async def test_an_admission_the_database_keeps_failing_names_the_id_to_retry_with(
    store: Store,
) -> None:
    """Catalogue C2: an ambiguous commit."""
    sid = await new_session(store)
    faults = Faults(store)
    faults.aborts = ADMIT_ATTEMPTS
    with pytest.raises(AdmissionUnavailableError, match="connection lost") as failed:
        await store.inputs.admit(sid, "hello")
    assert await written(store) == (1, 0)
    retried = await store.inputs.admit(sid, "hello", input_id=failed.value.input_id)
    assert faults.admitted == [retried.id] == [failed.value.input_id]


async def test_admission_is_idempotent_by_input_id(store: Store) -> None:
    """Catalogue S9: a duplicate prompt or start."""
    sid = await new_session(store)
    prompt = Prompt(
        text="look",
        files=(FileAttachment(mime="text/plain", data="aGk=", name="a.txt"),),
        metadata={"k": [1, 2]},
    )
    first = await store.inputs.admit(sid, prompt, input_id="msg_same", delivery="queue")
    latest = await store.events.latest_sequence(sid)
    again = await store.inputs.admit(sid, prompt, input_id="msg_same", delivery="queue")
    assert again == first
    assert await store.events.latest_sequence(sid) == latest
    assert await count(store, "session_input") == 1
    assert len(await events_of(store, sid, ADMITTED)) == 1


async def test_a_text_prompt_equals_the_same_prompt_model(store: Store) -> None:
    sid = await new_session(store)
    first = await store.inputs.admit(sid, "hi", input_id="msg_txt")
    assert await store.inputs.admit(sid, Prompt(text="hi"), input_id="msg_txt") == first


@pytest.mark.parametrize(
    "change",
    [
        {"prompt": "different"},
        {"delivery": "queue"},
        {"prompt": Prompt(text="same", metadata={"x": 1})},
        {"other_session": True},
    ],
    ids=["text", "delivery", "metadata", "session"],
)
async def test_different_content_under_a_used_input_id_conflicts(
    store: Store, change: dict[str, Any]
) -> None:
    sid = await new_session(store)
    other = await new_session(store)
    first = await store.inputs.admit(sid, "same", input_id="msg_dup")
    before = await written(store)
    with pytest.raises(InputConflictError) as raised:
        await store.inputs.admit(
            other if change.get("other_session") else sid,
            change.get("prompt", "same"),
            input_id="msg_dup",
            delivery=change.get("delivery", "steer"),
        )
    assert raised.value.input_id == "msg_dup"
    assert await written(store) == before
    assert await store.inputs.get("msg_dup") == first


async def test_admission_to_an_unknown_session_writes_nothing(store: Store) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.inputs.admit("ses_missing", "hello", input_id="msg_lost")
    assert await written(store) == (0, 0)
    assert await store.events.latest_sequence("ses_missing") == -1
    assert await store.inputs.get("msg_lost") is None


@pytest.mark.parametrize(
    ("prompt", "what", "index"),
    [
        (Prompt(text="half \ud83d an emoji"), "The prompt text", 5),
        (Prompt(text="split pair \ud83d\ude00"), "The prompt text", 11),
        (
            Prompt(
                text="fine",
                files=(FileAttachment(mime="text/plain", data="", name="bad\udcffname"),),
            ),
            "Attachment 1's name",
            3,
        ),
    ],
)
async def test_a_prompt_holding_a_lone_surrogate_is_refused_and_nothing_is_written(
    store: Store, prompt: Prompt, what: str, index: int
) -> None:
    sid = await new_session(store)
    before = await written(store)
    with pytest.raises(UnencodableTextError, match=r"lone surrogate U\+D") as refused:
        await store.inputs.admit(sid, prompt, input_id="msg_bad")
    assert (refused.value.what, refused.value.index) == (what, index)
    assert str(refused.value).startswith(f"{what} holds a lone surrogate")
    assert await written(store) == before
    assert await store.inputs.get("msg_bad") is None


async def test_compaction_for_an_unknown_session_writes_nothing(store: Store) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.inputs.admit_compaction("ses_missing")
    assert await written(store) == (0, 0)


@pytest.mark.parametrize(
    ("session", "input_id"),
    [
        ("bad id", None),
        ("", None),
        ("ses_ok", "../x"),
        ("ses_ok", "x" * 129),
        ("ses_ok", "msg'; DROP TABLE event; --"),
    ],
)
async def test_invalid_ids_are_refused_before_anything_is_written(
    store: Store, session: str, input_id: str | None
) -> None:
    await store.sessions.create("/work", session_id="ses_ok")
    before = await written(store)
    with pytest.raises(InvalidIdError):
        await store.inputs.admit(session, "hi", input_id=input_id)
    with pytest.raises(InvalidIdError):
        await store.inputs.admit_compaction(session, input_id=input_id)
    assert await written(store) == before


async def test_concurrent_duplicate_admissions_write_once(store: Store) -> None:
    """Catalogue S9: a duplicate prompt or start."""
    sid = await new_session(store)
    receipts = await asyncio.gather(
        *(store.inputs.admit(sid, "race", input_id="msg_race") for _ in range(5))
    )
    assert all(receipt == receipts[0] for receipt in receipts)
    assert await count(store, "session_input", "id = :id", id="msg_race") == 1
    assert len(await events_of(store, sid, ADMITTED)) == 1
    assert await store.events.latest_sequence(sid) == 1


@pytest.mark.breaks_invariants("I4", "I5")
async def test_admitting_the_id_of_an_existing_message_conflicts(store: Store) -> None:
    sid = await new_session(store)
    mid = message_id()
    await store.events.publish(
        ev.StepStarted(
            session_id=sid,
            assistant_message_id=mid,
            agent="build",
            model=ModelRef(provider_id="scripted", id="demo.json"),
        )
    )
    before = await written(store)
    with pytest.raises(InputConflictError):
        await store.inputs.admit(sid, "hi", input_id=mid)
    assert await written(store) == before
    assert await store.inputs.get(mid) is None


# --- manual compaction --------------------------------------------------------------------------


async def test_compaction_admission_queues_a_compaction_message(store: Store) -> None:
    sid = await new_session(store)
    cid = await store.inputs.admit_compaction(sid)
    receipt = await store.inputs.get(cid)
    assert receipt is not None
    assert (receipt.type, receipt.prompt, receipt.delivery, receipt.promoted_seq) == (
        "compaction",
        None,
        None,
        None,
    )
    (message,) = await store.sessions.messages(sid)
    assert isinstance(message, CompactionMessage)
    assert (message.id, message.input_id, message.status) == (cid, cid, "queued")
    assert message.seq == receipt.admitted_seq


async def test_a_second_compaction_returns_the_pending_one(store: Store) -> None:
    sid = await new_session(store)
    first = await store.inputs.admit_compaction(sid, input_id="msg_compact1")
    assert await store.inputs.admit_compaction(sid) == first
    assert await store.inputs.admit_compaction(sid, input_id="msg_compact2") == first
    assert await store.inputs.admit_compaction(sid, input_id="msg_compact1") == first
    assert await count(store, "session_input") == 1
    assert await store.inputs.get("msg_compact2") is None
    assert len(await store.sessions.messages(sid)) == 1


async def test_concurrent_compactions_admit_one(store: Store) -> None:
    sid = await new_session(store)
    ids = await asyncio.gather(*(store.inputs.admit_compaction(sid) for _ in range(5)))
    assert len(set(ids)) == 1
    assert await count(store, "session_input") == 1
    assert await store.inputs.get(ids[0]) is not None
    assert [m.id for m in await store.sessions.messages(sid)] == [ids[0]]
    assert await store.events.latest_sequence(sid) == 1


async def test_compaction_under_a_prompt_id_is_a_lifecycle_conflict(store: Store) -> None:
    sid = await new_session(store)
    await store.inputs.admit(sid, "hi", input_id="msg_prompt")
    with pytest.raises(LifecycleConflictError):
        await store.inputs.admit_compaction(sid, input_id="msg_prompt")
    assert await count(store, "session_input", "type = 'compaction'") == 0


async def test_waiting_answers_what_could_be_promoted_in_one_statement(store: Store) -> None:
    """``waiting``: (steer, queue, compaction) as ``pending_deliveries`` and
    ``pending_compaction`` answer them, in one statement (on PostgreSQL one round trip, where
    the two took seven with their transactions), inside a transaction too."""
    sid = await new_session(store)
    with statements(store) as sent:
        assert await store.inputs.waiting(sid) == (False, False, None)
    if store.db.dialect == "postgresql":
        assert len(sent) == 1, sent
    await store.inputs.admit(sid, "queued", delivery="queue")
    assert await store.inputs.waiting(sid) == (False, True, None)
    await store.inputs.admit(sid, "steer")
    assert await store.inputs.waiting(sid) == (True, True, None)
    compaction = await store.inputs.admit_compaction(sid)
    async with store.db.write() as tx:
        assert await store.inputs.waiting(sid, tx=tx) == (False, False, compaction)
    assert await store.inputs.pending_deliveries(sid) == (False, False)
    assert await store.inputs.pending_compaction(sid) == compaction


async def test_pending_compaction_is_a_barrier_for_prompts(store: Store) -> None:
    sid = await new_session(store)
    steer = await store.inputs.admit(sid, "steer before")
    await store.inputs.admit(sid, "queued before", delivery="queue")
    assert await store.inputs.has_pending(sid, "steer")
    assert await store.inputs.has_pending(sid, "queue")
    await store.inputs.admit_compaction(sid)
    await store.inputs.admit(sid, "steer after")

    assert not await store.inputs.has_pending(sid, "steer")
    assert not await store.inputs.has_pending(sid, "queue")
    assert await promote_steers(store, sid) == 0
    assert await promote_next_queued(store, sid) is False
    assert await user_messages(store, sid) == []
    assert await events_of(store, sid, PROMOTED) == []

    latest = await store.events.latest_sequence(sid)
    with pytest.raises(LifecycleConflictError):
        await store.events.publish(ev.PromptPromoted(session_id=sid, input_id=steer.id))
    assert await store.events.latest_sequence(sid) == latest
    assert (await store.inputs.get(steer.id)).promoted_seq is None  # type: ignore[union-attr]
    assert await user_messages(store, sid) == []


@pytest.mark.breaks_invariants("I4")
async def test_compaction_started_keeps_the_barrier(store: Store) -> None:
    sid = await new_session(store)
    await store.inputs.admit(sid, "wait")
    cid = await store.inputs.admit_compaction(sid)
    await store.events.publish(ev.CompactionStarted(session_id=sid, input_id=cid))
    assert not await store.inputs.has_pending(sid, "steer")
    (message,) = [m for m in await store.sessions.messages(sid) if m.id == cid]
    assert isinstance(message, CompactionMessage)
    assert message.status == "running"


@pytest.mark.parametrize(
    ("make_end", "status"),
    [
        (
            lambda sid, cid: ev.CompactionEnded(session_id=sid, input_id=cid, summary="S"),
            "completed",
        ),
        (
            lambda sid, cid: ev.CompactionFailed(
                session_id=sid,
                input_id=cid,
                error=SessionError(type="compaction.failed", message="no"),
            ),
            "failed",
        ),
    ],
    ids=["ended", "failed"],
)
@pytest.mark.breaks_invariants("I4")
async def test_the_end_of_the_compaction_releases_the_barrier(
    store: Store, make_end: Any, status: str
) -> None:
    sid = await new_session(store)
    steer = await store.inputs.admit(sid, "steer")
    cid = await store.inputs.admit_compaction(sid)
    await store.inputs.admit(sid, "queued", delivery="queue")
    end = await store.events.publish(make_end(sid, cid))

    compaction = await store.inputs.get(cid)
    assert compaction is not None
    assert compaction.promoted_seq == end.seq
    (message,) = [m for m in await store.sessions.messages(sid) if m.id == cid]
    assert isinstance(message, CompactionMessage)
    assert message.status == status
    assert message.seq == compaction.admitted_seq
    if status == "completed":
        assert message.summary == "S"

    assert await store.inputs.has_pending(sid, "steer")
    assert await store.inputs.has_pending(sid, "queue")
    assert await promote_steers(store, sid) == 1
    assert await promote_next_queued(store, sid) is True
    assert [m.text for m in await user_messages(store, sid)] == ["steer", "queued"]
    assert (await user_messages(store, sid))[0].id == steer.id

    another = await store.inputs.admit_compaction(sid)
    assert another != cid


@pytest.mark.breaks_invariants("I4")
async def test_another_sessions_compaction_end_does_not_release_the_barrier(
    store: Store,
) -> None:
    sid = await new_session(store)
    other = await new_session(store)
    await store.inputs.admit(sid, "wait")
    cid = await store.inputs.admit_compaction(sid)
    await store.events.publish(ev.CompactionEnded(session_id=other, input_id=cid, summary="x"))
    receipt = await store.inputs.get(cid)
    assert receipt is not None
    assert receipt.promoted_seq is None
    assert not await store.inputs.has_pending(sid, "steer")


@pytest.mark.breaks_invariants("I4")
async def test_a_compaction_end_naming_a_prompt_leaves_the_prompt_pending(store: Store) -> None:
    sid = await new_session(store)
    prompt = await store.inputs.admit(sid, "keep me")
    await store.events.publish(ev.CompactionEnded(session_id=sid, input_id=prompt.id, summary="x"))
    receipt = await store.inputs.get(prompt.id)
    assert receipt is not None
    assert receipt.promoted_seq is None
    assert await store.inputs.has_pending(sid, "steer")
    assert await promote_steers(store, sid) == 1
    assert [u.text for u in await user_messages(store, sid)] == ["keep me"]


# --- promotion ----------------------------------------------------------------------------------


@pytest.mark.breaks_invariants("I4")
async def test_promote_steers_promotes_every_pending_steer_in_order(store: Store) -> None:
    sid = await new_session(store)
    a = await store.inputs.admit(sid, "a")
    await store.inputs.admit(sid, "q", delivery="queue")
    b = await store.inputs.admit(
        sid,
        Prompt(
            text="b",
            files=(FileAttachment(mime="image/png", data="iVBO", name="x.png"),),
            metadata={"source": "cli"},
        ),
    )
    c = await store.inputs.admit(sid, "c")

    assert await promote_steers(store, sid) == 3

    promoted = await events_of(store, sid, PROMOTED)
    assert [e.data.input_id for e in promoted] == [a.id, b.id, c.id]  # type: ignore[attr-defined]
    users = await user_messages(store, sid)
    assert [u.id for u in users] == [a.id, b.id, c.id]
    assert [u.text for u in users] == ["a", "b", "c"]
    assert [u.seq for u in users] == [e.seq for e in promoted]
    assert users[1].files == [FileAttachment(mime="image/png", data="iVBO", name="x.png")]
    assert users[1].metadata == {"source": "cli"}
    assert [u.time_created for u in users] == [e.created for e in promoted]
    for receipt, event in zip((a, b, c), promoted, strict=True):
        stored = await store.inputs.get(receipt.id)
        assert stored is not None
        assert stored.promoted_seq == event.seq
        assert stored.admitted_seq == receipt.admitted_seq

    assert not await store.inputs.has_pending(sid, "steer")
    assert await store.inputs.has_pending(sid, "queue")
    assert await promote_steers(store, sid) == 0
    assert len(await events_of(store, sid, PROMOTED)) == 3


@pytest.mark.breaks_invariants("I4")
async def test_queued_prompts_are_promoted_one_at_a_time_fifo(store: Store) -> None:
    sid = await new_session(store)
    first = await store.inputs.admit(sid, "first", delivery="queue")
    await store.inputs.admit(sid, "steer")
    second = await store.inputs.admit(sid, "second", delivery="queue")

    assert await promote_next_queued(store, sid) is True
    assert [u.id for u in await user_messages(store, sid)] == [first.id]
    assert await store.inputs.has_pending(sid, "queue")
    assert await promote_next_queued(store, sid) is True
    assert [u.id for u in await user_messages(store, sid)] == [first.id, second.id]
    assert await promote_next_queued(store, sid) is False
    assert not await store.inputs.has_pending(sid, "queue")
    assert await store.inputs.has_pending(sid, "steer")
    assert [p.delivery for p in await store.inputs.pending(sid)] == ["steer"]


@pytest.mark.breaks_invariants("I4")
async def test_message_seq_is_the_promotion_seq_not_the_admission_seq(store: Store) -> None:
    sid = await new_session(store)
    receipt = await store.inputs.admit(sid, "later")
    await store.events.publish(ev.Synthetic(session_id=sid, text="in between"))
    await promote_steers(store, sid)
    (event,) = await events_of(store, sid, PROMOTED)
    (user,) = await user_messages(store, sid)
    assert user.seq == event.seq > receipt.admitted_seq
    assert [m.type for m in await store.sessions.messages(sid)] == ["synthetic", "user"]


@pytest.mark.breaks_invariants("I4")
async def test_promoting_an_input_twice_is_a_lifecycle_conflict(store: Store) -> None:
    sid = await new_session(store)
    receipt = await store.inputs.admit(sid, "once")
    await promote_steers(store, sid)
    latest = await store.events.latest_sequence(sid)
    with pytest.raises(LifecycleConflictError):
        await store.events.publish(ev.PromptPromoted(session_id=sid, input_id=receipt.id))
    assert await store.events.latest_sequence(sid) == latest
    assert len(await user_messages(store, sid)) == 1


async def test_promotion_in_a_fenced_transaction_carries_the_claim(store: Store) -> None:
    sid = await new_session(store)
    steers = [await store.inputs.admit(sid, f"s{i}") for i in range(2)]
    queued = await store.inputs.admit(sid, "q", delivery="queue")
    claim = await store.claims.acquire(sid, "exec-1", "owner-1")
    async with store.claims.fenced(claim) as tx:
        assert await store.inputs.promote_steers(tx, sid) == 2
    async with store.claims.fenced(claim) as tx:
        assert await store.inputs.promote_next_queued(tx, sid) is True

    promoted = await events_of(store, sid, PROMOTED)
    assert [e.data.input_id for e in promoted] == [  # type: ignore[attr-defined]
        steers[0].id,
        steers[1].id,
        queued.id,
    ]
    assert all((e.execution_id, e.epoch) == ("exec-1", claim.epoch) for e in promoted)
    admitted = await events_of(store, sid, ADMITTED)
    assert all((e.execution_id, e.epoch) == (None, None) for e in admitted)
    assert [u.id for u in await user_messages(store, sid)] == [s.id for s in [*steers, queued]]


async def test_a_failed_fenced_transaction_leaves_inputs_pending(store: Store) -> None:
    sid = await new_session(store)
    receipt = await store.inputs.admit(sid, "retry me")
    claim = await store.claims.acquire(sid, "exec-1", "owner-1")
    with pytest.raises(RuntimeError):
        async with store.claims.fenced(claim) as tx:
            assert await store.inputs.promote_steers(tx, sid) == 1
            raise RuntimeError("the step failed after promotion")
    assert await events_of(store, sid, PROMOTED) == []
    assert (await store.inputs.get(receipt.id)).promoted_seq is None  # type: ignore[union-attr]
    assert await user_messages(store, sid) == []
    assert await store.inputs.has_pending(sid, "steer")


async def test_inputs_of_other_sessions_are_not_promoted(store: Store) -> None:
    sid = await new_session(store)
    other = await new_session(store)
    await store.inputs.admit(other, "not mine")
    await store.inputs.admit(other, "not mine either", delivery="queue")
    assert await promote_steers(store, sid) == 0
    assert await promote_next_queued(store, sid) is False
    assert await user_messages(store, other) == []
