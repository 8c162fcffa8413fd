"""Lock order on PostgreSQL: batches over the same aggregates never deadlock."""

from __future__ import annotations

import asyncio

from store import Store
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.helpers import Probe, backend_pid, until_waiting_for


async def test_batches_over_the_same_aggregates_lock_their_sequences_in_one_order(
    postgres_target: Target,
) -> None:
    """A batch takes its aggregates' sequence rows sorted by id, whatever its event order:
    two transactions over the same aggregates wait for each other, never deadlock. PostgreSQL
    only: SQLite write transactions are exclusive, so there is no row lock to order."""
    store = await postgres_target.open()
    store.events.registry.register(Probe)
    try:
        await _two_batches(store)
    finally:
        await store.close()


async def _two_batches(store: Store) -> None:

    async def batch() -> list[StoredEvent]:
        async with store.db.write() as tx:
            events = [Probe(session_id="ses_b", value=1), Probe(session_id="ses_a", value=1)]
            return await store.events.publish_many(events, tx=tx)

    async with store.db.write() as first:
        await store.events.publish(Probe(session_id="ses_a"), tx=first)
        other = asyncio.create_task(batch())
        await until_waiting_for(store, await backend_pid(first))  # for ses_a, holding nothing
        await store.events.publish(Probe(session_id="ses_b"), tx=first)
    stored = await asyncio.wait_for(other, 30)
    assert [(e.aggregate_id, e.seq) for e in stored] == [("ses_b", 1), ("ses_a", 1)]


async def test_a_follower_never_skips_a_commit_that_lands_late(postgres_target: Target) -> None:
    """S4: commit order against id order. Transaction A takes the session's next seq and holds
    its commit; B appends to the same session meanwhile. B waits on the seq row A holds (the
    cursor is the per-session seq, allocated under that lock), so it can neither take A's seq
    nor commit ahead of it; a follower that catches up meanwhile sees A's event before B's,
    each once."""
    store = await postgres_target.open()
    store.events.registry.register(Probe)
    received: list[int] = []
    try:
        await store.events.publish(Probe(session_id="ses_s4", value=0))

        async def follow() -> None:
            async for item in store.events.log("ses_s4", follow=True, poll_interval=0.05):
                if isinstance(item, StoredEvent):
                    assert isinstance(item.data, Probe)
                    received.append(item.data.value)
                    if len(received) == 3:
                        return

        following = asyncio.create_task(follow())
        async with store.db.write() as first:
            await store.events.publish(Probe(session_id="ses_s4", value=1), tx=first)
            second = asyncio.create_task(store.events.publish(Probe(session_id="ses_s4", value=2)))
            await until_waiting_for(store, await backend_pid(first))
            assert not second.done()
        stored = await asyncio.wait_for(second, 30)
        await asyncio.wait_for(following, 30)
    finally:
        await store.close()
    assert stored.seq == 2
    assert received == [0, 1, 2]
