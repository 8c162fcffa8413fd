"""The store's outcomes do not hang on the database's default isolation (catalogue S12).

Each test sets the default of a database of its own (``ALTER DATABASE ... SET
default_transaction_isolation``) to REPEATABLE READ or SERIALIZABLE, then runs the claim race
(F1), the same-seq conflict (S1) and gap-free appends under rollbacks (S3) against it, with
several stores (each its own connections) in one process. The writer that bypasses the
sequence row is a raw connection, so it runs at the database's default.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from sessionflow.errors import ClaimHeldError, SequenceConflictError
from store import Store
from store.claims import Claim
from tests.conftest import Target
from tests.store.conftest import libpq
from tests.store.helpers import (
    Probe,
    appends_with_rollbacks,
    backend_pid,
    count,
    rows,
    until_waiting_for,
)
from tests.store.test_fast import INTRUDER, claimed, deltas

STORES = 4
SESSIONS = 20
APPENDS = 400  # attempted, across the stores; about 30 % of them aborted

pytestmark = pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])


@pytest.fixture
async def stores(own_database: str, isolation: str) -> AsyncIterator[list[Store]]:
    with psycopg.connect(libpq(own_database), autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(
            f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = '{isolation}'"
        )
    opened = [await Target(own_database).open() for _ in range(STORES)]
    for store in opened:
        store.events.registry.register(Probe)
    yield opened
    for store in opened:
        await store.close()


async def test_a_claim_race_has_one_winner_whatever_the_default_isolation(
    stores: list[Store], isolation: str
) -> None:
    """S12 with F1: four stores claim each of 20 idle sessions at once. One winner per
    session, at epoch 1; every loser gets ``ClaimHeldError`` naming the winner; one
    ``session_execution`` row per session, the winner's."""
    first = stores[0]
    sessions = [(await first.sessions.create("/race")).id for _ in range(SESSIONS)]
    winners = {}
    for sid in sessions:
        outcomes = await asyncio.gather(
            *(s.claims.acquire(sid, f"exec_{i}_{sid}", f"owner-{i}") for i, s in enumerate(stores)),
            return_exceptions=True,
        )
        won = [o for o in outcomes if isinstance(o, Claim)]
        assert len(won) == 1 and won[0].epoch == 1, outcomes
        held = [o for o in outcomes if isinstance(o, ClaimHeldError)]
        assert len(held) == STORES - 1 and {h.execution_id for h in held} == {won[0].execution_id}
        winners[sid] = won[0].execution_id
    claims = await rows(first, "SELECT session_id, id, epoch FROM session_execution")
    assert {sid: (eid, epoch) for sid, eid, epoch in claims} == {
        sid: (eid, 1) for sid, eid in winners.items()
    }


async def test_a_same_seq_conflict_leaves_one_winner_whatever_the_default_isolation(
    stores: list[Store], own_database: str, isolation: str
) -> None:
    """S12 with S1, both writers in flight: a raw writer bypassing the sequence row (at the
    database's default isolation) holds seq k uncommitted while a claimed append waits for it on
    the unique index, then commits: the append raises ``SequenceConflictError`` and writes
    nothing. In the other order the claimed transaction holds seq k and the raw writer is
    refused; the claimed events stand."""
    store = stores[0]
    (sid, claim), (other_sid, other_claim) = await claimed(store, 2)
    await store.append(claim, deltas(sid, 2))
    k = await store.events.latest_sequence(sid) + 1
    insert = INTRUDER.format(id="%s", a="%s", k=k)
    async with await psycopg.AsyncConnection.connect(libpq(own_database)) as rogue:
        level = await (await rogue.execute("SHOW transaction_isolation")).fetchone()
        assert level == (isolation,)
        await rogue.execute(insert, [f"evt_in_{sid}", sid])
        appending = asyncio.create_task(store.append(claim, deltas(sid, 3)))
        await until_waiting_for(store, rogue.info.backend_pid)
        await rogue.commit()
    with pytest.raises(SequenceConflictError):
        await appending
    assert await count(store, "event", "aggregate_id = :a", a=sid) == k + 1
    assert await store.events.latest_sequence(sid) == k - 1

    sid, claim = other_sid, other_claim
    k = await store.events.latest_sequence(sid) + 1
    insert = INTRUDER.format(id="%s", a="%s", k=k)
    async with await psycopg.AsyncConnection.connect(libpq(own_database)) as rogue:
        async with store.claims.fenced(claim) as tx:
            for event in deltas(sid, 3):
                await store.events.publish(event, tx=tx)
            pid = await backend_pid(tx)
            intruding = asyncio.create_task(rogue.execute(insert, [f"evt_in_{sid}", sid]))
            await until_waiting_for(store, pid)
        # A unique violation, or under SERIALIZABLE possibly a serialization failure: refused.
        with pytest.raises((psycopg.errors.UniqueViolation, psycopg.errors.SerializationFailure)):
            await intruding
    taken = await rows(store, "SELECT id FROM event WHERE aggregate_id = :a", a=sid)
    assert f"evt_in_{sid}" not in {row[0] for row in taken}
    assert await store.events.latest_sequence(sid) == k + 2


async def test_appends_with_aborts_stay_gap_free_whatever_the_default_isolation(
    stores: list[Store], isolation: str
) -> None:
    """S12 with S3: four stores append 400 events at once to one aggregate, about 30 % of the
    transactions aborted after their insert: the committed seqs are exactly 0 .. committed - 1."""

    committed = await appends_with_rollbacks(stores, APPENDS)
    assert 0.5 * APPENDS < committed < 0.9 * APPENDS
