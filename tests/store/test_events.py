"""The event store contract (reference §2, catalogue §7.3), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sessionflow.errors import InvalidDurableEventError, InvalidIdError, PayloadTooLargeError
from store import Store
from store.db import Tx
from store.events import SerializedEvent, StoredEvent, Synced
from tests.store.helpers import (
    Keyed,
    Probe,
    ProbeV2,
    count,
    rows,
)

AGG = "ses_events"


def serialized(
    seq: int, value: int = 0, *, id: str | None = None, agg: str = AGG
) -> SerializedEvent:
    return SerializedEvent(
        id=id or f"evt_{agg}_{seq}",
        type="test.sync.1",
        seq=seq,
        aggregate_id=agg,
        data={"type": "test.sync", "session_id": agg, "value": value},
        created=1000 + seq,
    )


async def collect(store: Store, *, after: int = -1, agg: str = AGG) -> list[StoredEvent | Synced]:
    return [item async for item in store.events.log(agg, after=after)]


def seqs(items: list[Any]) -> list[int]:
    return [item.seq for item in items if isinstance(item, StoredEvent)]


@pytest.fixture(autouse=True)
def register_test_events(store: Store) -> None:
    for cls in (Probe, ProbeV2, Keyed):
        store.events.registry.register(cls)


# --- publish ------------------------------------------------------------------------------------


async def test_publish_inserts_versioned_rows_with_gap_free_seq(store: Store) -> None:
    first = await store.events.publish(Probe(session_id=AGG, value=1))
    second = await store.events.publish(Probe(session_id=AGG, value=2))
    other = await store.events.publish(Probe(session_id="ses_other", value=3))
    assert (first.seq, second.seq, other.seq) == (0, 1, 0)
    stored = await rows(
        store, "SELECT seq, type FROM event WHERE aggregate_id = :a ORDER BY seq", a=AGG
    )
    assert stored == [(0, "test.sync.1"), (1, "test.sync.1")]


async def test_publish_uses_the_definition_version(store: Store) -> None:
    stored = await store.events.publish(ProbeV2(session_id=AGG, value=1, label="v2"))
    assert stored.type == "test.sync.2"
    page = await store.events.read_after(AGG)
    assert isinstance(page.events[0].data, ProbeV2)
    assert page.events[0].data.label == "v2"


async def test_custom_aggregate_field(store: Store) -> None:
    stored = await store.events.publish(Keyed(key="custom_agg", text="hi"))
    assert stored.aggregate_id == "custom_agg"
    assert await store.events.latest_sequence("custom_agg") == 0


async def test_projectors_run_inline_before_the_commit_hook(store: Store) -> None:
    order: list[str] = []

    async def projector(tx: Tx, event: StoredEvent) -> None:
        order.append("projector")

    async def hook(tx: Tx, seq: int) -> None:
        order.append(f"commit:{seq}")

    store.events.project(Probe, projector)
    await store.events.publish(Probe(session_id=AGG), commit=hook)
    assert order == ["projector", "commit:0"]


async def test_failing_commit_hook_rolls_back_event_sequence_and_projection(store: Store) -> None:
    async def projector(tx: Tx, event: StoredEvent) -> None:
        await store.events.publish(Keyed(key="probe_side_effect"), tx=tx)

    async def hook(tx: Tx, seq: int) -> None:
        raise RuntimeError("commit failed")

    store.events.project(Probe, projector)
    with pytest.raises(RuntimeError, match="commit failed"):
        await store.events.publish(Probe(session_id=AGG), commit=hook)
    assert await count(store, "event") == 0
    assert await count(store, "event_sequence") == 0


def committed_ids(store: Store, aggregate_id: str) -> list[str]:
    """The aggregate's event ids as another connection sees them: only what was committed."""
    url = make_url(store.db.url)
    query = "SELECT id FROM {} WHERE aggregate_id = {} ORDER BY seq"
    if store.db.dialect == "sqlite":
        with sqlite3.connect(str(url.database)) as conn:
            found = conn.execute(query.format("event", "?"), (aggregate_id,)).fetchall()
    else:
        table = f'"{store.db.schema}".event' if store.db.schema else "event"
        libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(libpq) as conn:
            found = conn.execute(query.format(table, "%s"), (aggregate_id,)).fetchall()
    return [row[0] for row in found]


async def test_listeners_run_after_commit_and_can_read_the_row(store: Store) -> None:
    """Reference §7.3 #14: a global listener hears a durable event only once it is committed,
    so it can read its row (from a connection of its own, inside the call)."""
    seen: list[tuple[int, list[str]]] = []
    store.events.listen(lambda event: seen.append((event.seq, committed_ids(store, AGG))))
    stored = await store.events.publish(Probe(session_id=AGG))
    assert seen == [(0, [stored.id])]
    assert await count(store, "event") == 1


async def test_listener_defects_are_isolated_after_commit(store: Store) -> None:
    def broken(event: StoredEvent) -> None:
        raise RuntimeError("listener bug")

    seen: list[int] = []
    store.events.listen(broken)
    store.events.listen(lambda event: seen.append(event.seq))
    stored = await store.events.publish(Probe(session_id=AGG))
    assert stored.seq == 0 and seen == [0]


async def test_unsubscribed_listener_stops_hearing(store: Store) -> None:
    seen: list[int] = []
    unsubscribe = store.events.listen(lambda event: seen.append(event.seq))
    await store.events.publish(Probe(session_id=AGG))
    unsubscribe()
    await store.events.publish(Probe(session_id=AGG))
    assert seen == [0]


async def test_republishing_an_identical_event_is_a_no_op(store: Store) -> None:
    """Catalogue C2: an ambiguous commit."""
    projected: list[int] = []

    async def projector(tx: Tx, event: StoredEvent) -> None:
        projected.append(event.seq)

    store.events.project(Probe, projector)
    first = await store.events.publish(Probe(session_id=AGG, value=7), id="evt_retry")
    again = await store.events.publish(Probe(session_id=AGG, value=7), id="evt_retry")
    assert (again.seq, again.id) == (first.seq, first.id)
    assert projected == [0]
    assert await count(store, "event") == 1


async def test_a_reused_event_id_with_other_content_is_refused(store: Store) -> None:
    await store.events.publish(Probe(session_id=AGG, value=1), id="evt_taken")
    with pytest.raises(
        InvalidDurableEventError, match="Event evt_taken already exists at aggregate"
    ):
        await store.events.publish(Probe(session_id=AGG, value=2), id="evt_taken")
    assert await count(store, "event") == 1


async def test_batch_is_atomic_when_one_event_is_invalid(store: Store) -> None:
    """Catalogue S2: batch atomicity."""
    small = await store.events.publish(Probe(session_id=AGG))
    batch = [Keyed(key=AGG, text="x") for _ in range(100)]
    batch[56] = Keyed(key=AGG, text="y" * (5 * 1024 * 1024))
    with pytest.raises(PayloadTooLargeError, match="above the limit"):
        await store.events.publish_many(batch)
    assert await count(store, "event") == 1
    assert await store.events.latest_sequence(AGG) == small.seq


async def test_a_batch_that_fails_inside_its_transaction_commits_none_of_it(store: Store) -> None:
    """Catalogue S2, past validation: the 57th event's projection fails inside the batch's
    transaction, after the batch had written there (its seqs allocated: the projector reads
    the sequence row moved on by 100). None of the batch commits, the latest seq is
    unchanged, and the next append takes the next seq: nothing of the failed batch holds a
    place."""
    small = await store.events.publish(Probe(session_id=AGG))
    written: list[int] = []

    async def projector(tx: Tx, event: StoredEvent) -> None:
        if isinstance(event.data, Keyed) and event.data.text == "boom":
            query = "SELECT seq FROM event_sequence WHERE aggregate_id = :agg"
            result = await tx.conn.execute(sa.text(query), {"agg": AGG})
            written.append(int(result.scalar_one()))
            raise RuntimeError("the projection failed")

    store.events.project(Keyed, projector)
    batch = [Keyed(key=AGG, text=str(i)) for i in range(100)]
    batch[56] = Keyed(key=AGG, text="boom")
    with pytest.raises(RuntimeError, match="the projection failed"):
        await store.events.publish_many(batch)
    assert written == [small.seq + 100]  # allocated in the transaction that then failed
    assert await count(store, "event") == 1
    assert await store.events.latest_sequence(AGG) == small.seq
    after = await store.events.publish(Probe(session_id=AGG))
    assert after.seq == small.seq + 1


async def test_batch_append_is_contiguous(store: Store) -> None:
    stored = await store.events.publish_many([Keyed(key=AGG, text=str(i)) for i in range(100)])
    assert [event.seq for event in stored] == list(range(100))
    assert seqs(await collect(store)) == list(range(100))


async def test_invalid_aggregate_id_is_refused_before_writing(store: Store) -> None:
    with pytest.raises(InvalidIdError, match="Invalid aggregate id"):
        await store.events.publish(Probe(session_id="'; DROP TABLE event; --"))
    assert await count(store, "event") == 0


# --- replay -------------------------------------------------------------------------------------


async def test_replay_inserts_external_rows_through_projectors(store: Store) -> None:
    projected: list[int] = []

    async def projector(tx: Tx, event: StoredEvent) -> None:
        projected.append(event.seq)

    store.events.project(Probe, projector)
    stored = await store.events.replay(serialized(0))
    assert stored is not None and stored.seq == 0 and stored.created == 1000
    assert projected == [0]
    assert await rows(store, "SELECT id, seq FROM event") == [(f"evt_{AGG}_0", 0)]


async def test_replay_rejects_an_envelope_aggregate_that_differs_from_its_payload(
    store: Store,
) -> None:
    event = serialized(0)
    bad = SerializedEvent(event.id, event.type, 0, "ses_elsewhere", event.data, event.created)
    with pytest.raises(
        InvalidDurableEventError, match=f"Aggregate mismatch: expected ses_elsewhere, got {AGG}"
    ):
        await store.events.replay(bad)
    assert await count(store, "event") == 0


async def test_replay_refuses_a_sequence_gap(store: Store) -> None:
    await store.events.replay(serialized(0))
    with pytest.raises(
        InvalidDurableEventError, match=f"Sequence mismatch for aggregate {AGG}: expected 1, got 5"
    ):
        await store.events.replay(serialized(5))


async def test_replay_of_an_unknown_type_fails(store: Store) -> None:
    event = SerializedEvent("evt_x", "test.nothing.1", 0, AGG, {"session_id": AGG})
    with pytest.raises(
        InvalidDurableEventError, match=r"Unknown durable event type test\.nothing\.1"
    ):
        await store.events.replay(event)


async def test_identical_replay_is_a_no_op_and_is_not_republished(store: Store) -> None:
    heard: list[int] = []
    store.events.listen(lambda event: heard.append(event.seq))
    assert await store.events.replay(serialized(0), publish=True) is not None
    assert await store.events.replay(serialized(0), publish=True) is None
    assert heard == [0]
    assert await count(store, "event") == 1


async def test_divergent_replay_fails(store: Store) -> None:
    """Reference §7.3 #42: a stale replay (at a stored position) that diverges from the stored
    event is refused without being published, and the log stays as it was."""
    heard: list[int] = []
    store.events.listen(lambda event: heard.append(event.seq))
    await store.events.replay_all([serialized(0, value=1), serialized(1, value=1)], publish=True)
    before = await collect(store)
    with pytest.raises(
        InvalidDurableEventError, match=f"Replay diverged at aggregate {AGG} sequence 0"
    ):
        await store.events.replay(serialized(0, value=2), publish=True)
    assert heard == [0, 1]  # the accepted replays only
    after = await collect(store)
    assert after == before
    assert [e.data.model_dump()["value"] for e in after if isinstance(e, StoredEvent)] == [1, 1]
    assert await store.events.latest_sequence(AGG) == 1


async def test_an_event_id_reused_at_another_position_is_refused(store: Store) -> None:
    await store.events.replay(serialized(0, id="evt_dup"))
    with pytest.raises(
        InvalidDurableEventError,
        match=f"Event evt_dup already exists at aggregate {AGG} sequence 0",
    ):
        await store.events.replay(serialized(1, id="evt_dup"))


async def test_replay_all_validates_one_contiguous_aggregate(store: Store) -> None:
    assert await store.events.replay_all([]) is None
    assert await store.events.replay_all([serialized(0), serialized(1)]) == AGG
    assert await store.events.replay_all([serialized(2), serialized(3)]) == AGG
    assert seqs(await collect(store)) == [0, 1, 2, 3]
    with pytest.raises(
        InvalidDurableEventError, match="Replay events must belong to the same aggregate"
    ):
        await store.events.replay_all([serialized(4), serialized(5, agg="ses_b")])
    with pytest.raises(
        InvalidDurableEventError, match="Replay sequence mismatch at index 1: expected 5, got 6"
    ):
        await store.events.replay_all([serialized(4), serialized(6)])
    assert await store.events.latest_sequence(AGG) == 3


async def test_claim_fences_replay_from_another_owner(store: Store) -> None:
    await store.events.replay(serialized(0))
    await store.events.claim(AGG, "owner-a")
    assert await store.events.replay(serialized(1), owner_id="owner-b") is None
    assert await store.events.latest_sequence(AGG) == 0
    assert await store.events.replay(serialized(1), owner_id="owner-a") is not None


async def test_strict_owner_rejects_exact_replay_of_another_owner(store: Store) -> None:
    await store.events.replay(serialized(0), owner_id="owner-a")
    with pytest.raises(
        InvalidDurableEventError,
        match=f"Replay owner mismatch for aggregate {AGG}: expected owner-a, got owner-b",
    ):
        await store.events.replay(serialized(0), owner_id="owner-b", strict_owner=True)
    with pytest.raises(InvalidDurableEventError, match="got none"):
        await store.events.replay(serialized(1), strict_owner=True)


async def test_exact_replay_claims_an_unowned_aggregate(store: Store) -> None:
    await store.events.replay(serialized(0))
    assert await store.events.replay(serialized(0), owner_id="owner-a") is None
    assert await rows(store, "SELECT owner_id FROM event_sequence") == [("owner-a",)]
    with pytest.raises(InvalidDurableEventError, match="Replay owner mismatch"):
        await store.events.replay(serialized(1), owner_id="owner-b", strict_owner=True)


async def test_replay_with_owner_claims_a_new_sequence(store: Store) -> None:
    await store.events.replay(serialized(0), owner_id="owner-1")
    assert await rows(store, "SELECT seq, owner_id FROM event_sequence") == [(0, "owner-1")]


async def test_replay_claims_an_existing_unowned_sequence_before_fencing_another_owner(
    store: Store,
) -> None:
    """Reference §7.3 #39: an owner's replay at the next position of a sequence that exists
    but has no owner is accepted and claims it; a different owner is then fenced."""
    await store.events.replay(serialized(0))
    assert await rows(store, "SELECT seq, owner_id FROM event_sequence") == [(0, None)]
    assert await store.events.replay(serialized(1), owner_id="owner-1") is not None
    assert await store.events.replay(serialized(2), owner_id="owner-2") is None
    assert seqs(await collect(store)) == [0, 1]
    assert await rows(store, "SELECT seq, owner_id FROM event_sequence") == [(1, "owner-1")]


async def test_replay_from_a_different_owner_leaves_the_claimed_sequence_alone(
    store: Store,
) -> None:
    heard: list[int] = []
    store.events.listen(lambda event: heard.append(event.seq))
    await store.events.replay(serialized(0), owner_id="owner-1")
    assert await store.events.replay(serialized(1), owner_id="owner-2", publish=True) is None
    assert await rows(store, "SELECT seq, owner_id FROM event_sequence") == [(0, "owner-1")]
    assert await count(store, "event") == 1 and heard == []


async def test_claim_is_last_writer_wins_and_creates_no_row(store: Store) -> None:
    await store.events.claim("ses_nothing", "owner-1")
    assert await count(store, "event_sequence") == 0
    await store.events.replay(serialized(0))
    await store.events.claim(AGG, "owner-1")
    await store.events.claim(AGG, "owner-2")
    assert await rows(store, "SELECT owner_id FROM event_sequence") == [("owner-2",)]


async def test_remove_clears_the_aggregate(store: Store) -> None:
    await store.events.replay_all([serialized(0), serialized(1)])
    await store.events.remove(AGG)
    assert await count(store, "event") == 0
    assert await store.events.replay(serialized(0, id="evt_again")) is not None


# --- reads --------------------------------------------------------------------------------------


async def test_log_without_follow_replays_and_ends_with_synced(store: Store) -> None:
    assert await collect(store) == [Synced(AGG, None)]
    for value in range(3):
        await store.events.publish(Probe(session_id=AGG, value=value))
    items = await collect(store, after=0)
    assert seqs(items) == [1, 2]
    assert items[-1] == Synced(AGG, 2)


async def test_log_reads_across_pages(store: Store) -> None:
    store.events.page_size = 2
    for value in range(5):
        await store.events.publish(Probe(session_id=AGG, value=value))
    assert seqs(await collect(store)) == [0, 1, 2, 3, 4]
    page = await store.events.read_after(AGG, 0)
    assert [event.seq for event in page.events] == [1, 2] and page.cursor == 2


async def test_read_after_skips_unknown_types_but_advances(store: Store) -> None:
    await store.events.publish(Probe(session_id=AGG))
    await store.events.publish(Keyed(key=AGG, text="from the future"))
    await store.events.publish(Probe(session_id=AGG))
    store.events.registry._by_stored.pop("test.keyed.1")
    page = await store.events.read_after(AGG)
    assert [event.seq for event in page.events] == [0, 2] and page.cursor == 2


async def test_follow_emits_synced_at_the_handoff_then_live_events(store: Store) -> None:
    """Catalogue S5: the history-then-live handoff."""
    await store.events.publish(Probe(session_id=AGG, value=0))
    received: list[StoredEvent | Synced] = []

    async def follow() -> None:
        async for item in store.events.log(AGG, follow=True):
            received.append(item)
            if isinstance(item, StoredEvent) and item.seq == 2:
                return

    task = asyncio.create_task(follow())
    while not received:
        await asyncio.sleep(0.01)
    await store.events.publish(Probe(session_id=AGG, value=1))
    await store.events.publish(Probe(session_id=AGG, value=2))
    await asyncio.wait_for(task, 10)
    assert seqs(received) == [0, 1, 2]
    assert received[1] == Synced(AGG, 0)


async def test_follow_catches_events_committed_during_history_replay(store: Store) -> None:
    """Catalogue S5: the history-then-live handoff."""
    store.events.page_size = 1
    for value in range(3):
        await store.events.publish(Probe(session_id=AGG, value=value))
    received: list[StoredEvent | Synced] = []
    async for item in store.events.log(AGG, follow=True):
        received.append(item)
        if isinstance(item, StoredEvent) and item.seq == 0:
            # Committed while the follower is still reading history (snapshot was seq 2).
            await store.events.publish(Probe(session_id=AGG, value=3))
        if isinstance(item, StoredEvent) and item.seq == 3:
            break
    assert seqs(received) == [0, 1, 2, 3]
    assert received[3] == Synced(AGG, 2)


async def test_follow_drains_every_committed_event_in_order(store: Store) -> None:
    received: list[int] = []

    async def follow() -> None:
        async for item in store.events.log(AGG, follow=True):
            if isinstance(item, StoredEvent):
                received.append(item.seq)
                if item.seq == 63:
                    return

    task = asyncio.create_task(follow())
    for value in range(64):
        await store.events.publish(Probe(session_id=AGG, value=value))
    await asyncio.wait_for(task, 10)
    assert received == list(range(64))


async def test_sequences_and_latest_sequence(store: Store) -> None:
    assert await store.events.sequences([]) == {}
    await store.events.publish(Probe(session_id="ses_a"))
    await store.events.publish(Probe(session_id="ses_a"))
    await store.events.publish(Probe(session_id="ses_b"))
    assert await store.events.sequences(["ses_a", "ses_b", "ses_unknown"]) == {
        "ses_a": 1,
        "ses_b": 0,
    }
    assert await store.events.latest_sequence("ses_unknown") == -1


async def test_reserve_sequence_moves_the_next_seq_up(store: Store) -> None:
    await store.events.reserve_sequence(AGG, 9)
    stored = await store.events.publish(Probe(session_id=AGG))
    assert stored.seq == 10
    await store.events.reserve_sequence(AGG, 3)
    assert await store.events.latest_sequence(AGG) == 10
