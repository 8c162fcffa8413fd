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
