"""Catalogue C6 at the store: which refusals are retried, and which are the caller's."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sessionflow.errors import StoreError
from sessionflow.models import events as ev
from store import Store
from store.db import Tx
from tests.conftest import Target
from tests.faults import Fault, Injector, injecting
from tests.store.helpers import count
from tests.store.test_fast import claimed, deltas


def transients(target: Target) -> list[Fault]:
    if target.backend == "sqlite":
        # The write lock another connection holds: the inline BEGIN gives way to the
        # connection that waits for it (a second busy would be its busy timeout running out).
        return ["busy"]
    return ["serialization", "deadlock"]


async def test_transient_refusals_are_retried_and_the_write_commits_once(
    store: Store, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C6: a write meets two transient refusals (40001 then 40P01 on PostgreSQL; SQLITE_BUSY
    at its BEGIN on SQLite, which the store waits out on its other connection) and commits
    once; an admission and a hot-path batch do too."""
    with injecting(monkeypatch) as faults:
        runs = 0

        async def work(tx: Tx) -> None:
            nonlocal runs
            runs += 1
            await tx.conn.exec_driver_sql(
                "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('agg_c6', 0)"
            )

        faults.arm(before=transients(target))
        await store.db.transact(work)
        assert faults.seen == dict.fromkeys(transients(target), 1)
        assert not faults.before, "a fault was never met"
        assert runs == (1 if target.backend == "sqlite" else 3)
        assert await count(store, "event_sequence", "aggregate_id = 'agg_c6'") == 1

        ((sid, claim),) = await claimed(store)
        faults.arm(before=transients(target))
        receipt = await store.inputs.admit(sid, "hello")
        assert receipt.admitted_seq > 0 and not faults.before
        faults.arm(before=[*transients(target)[:1], "connection"])
        await store.append(claim, deltas(sid, 3), step_attempt=1)
    assert await count(store, "event", "aggregate_id = :a AND type = :t", a=sid, t=_DELTA) == 3


_DELTA = ev.TextDelta.stored_type()


@pytest.mark.parametrize(
    "statement",
    [
        "SELEC 1",  # a syntax error
        "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('agg_taken', 0)",  # unique key
    ],
)
async def test_other_sql_errors_are_not_retried(store: Store, statement: str) -> None:
    """C6: a statement the database refuses for what it says (syntax, a constraint) fails at
    once, untyped as transient, and is run once."""
    await store.db.transact(
        lambda tx: tx.conn.exec_driver_sql(
            "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('agg_taken', 0)"
        )
    )
    runs = 0

    async def work(tx: Tx) -> None:
        nonlocal runs
        runs += 1
        await tx.conn.exec_driver_sql(statement)

    with pytest.raises(sa.exc.DBAPIError) as raised:
        await store.db.transact(work)
    assert runs == 1
    assert not isinstance(raised.value, StoreError)


def aim(faults: Injector, target: Target, marker: str) -> None:
    """Transient refusals for the work's own statement (PostgreSQL: after the fence, so the
    work itself must run again), or for the transaction's BEGIN (SQLite's busy)."""
    if target.backend == "sqlite":
        faults.arm(before=transients(target))
    else:
        faults.strike(marker, transients(target))


async def test_fenced_work_is_run_again_after_conflicts_under_its_fence(
    store: Store, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C6: ``run_fenced``'s work (a write under the claim) and ``acquire_with``'s (what a new
    claim starts) meet two transient refusals and run again from the start, fence and all:
    each write commits once."""
    ((_sid, claim),) = await claimed(store)
    other = (await store.sessions.create("/work")).id
    with injecting(monkeypatch) as faults:
        runs = {"fenced": 0, "acquired": 0}

        async def write(tx: Tx, aggregate: str, key: str) -> None:
            runs[key] += 1
            await tx.conn.exec_driver_sql(
                f"INSERT INTO event_sequence (aggregate_id, seq) VALUES ('{aggregate}', 0)"
            )

        aim(faults, target, "agg_fenced")
        await store.claims.run_fenced(claim, lambda tx: write(tx, "agg_fenced", "fenced"))
        aim(faults, target, "agg_acquired")
        acquired = await store.claims.acquire_with(
            other, "exec_c6", "owner-c6", lambda _claim, tx: write(tx, "agg_acquired", "acquired")
        )
        assert not faults.before and not faults.strikes, "a fault was never met"
    expected = 1 if target.backend == "sqlite" else 3  # SQLite's busy strikes before the work
    assert runs == {"fenced": expected, "acquired": expected}
    assert await count(store, "event_sequence", "aggregate_id = 'agg_fenced'") == 1
    assert await count(store, "event_sequence", "aggregate_id = 'agg_acquired'") == 1
    assert acquired.epoch == 1 and (await store.claims.current(other)) is not None


@pytest.mark.parametrize("form", ["run_fenced", "acquire_with"])
async def test_other_sql_errors_in_fenced_work_are_not_retried(store: Store, form: str) -> None:
    """C6: work under a fence whose statement the database refuses for what it says (here a
    syntax error) fails at once, untyped as transient, run once; nothing it wrote stays."""
    ((_sid, claim),) = await claimed(store)
    other = (await store.sessions.create("/work")).id
    runs = 0

    async def work(tx: Tx) -> None:
        nonlocal runs
        runs += 1
        await tx.conn.exec_driver_sql(
            "INSERT INTO event_sequence (aggregate_id, seq) VALUES ('agg_refused', 0)"
        )
        await tx.conn.exec_driver_sql("SELEC 1")

    with pytest.raises(sa.exc.DBAPIError) as raised:
        if form == "run_fenced":
            await store.claims.run_fenced(claim, work)
        else:
            await store.claims.acquire_with(other, "exec_c6", "owner-c6", lambda _c, tx: work(tx))
    assert runs == 1
    assert not isinstance(raised.value, StoreError)
    assert await count(store, "event_sequence", "aggregate_id = 'agg_refused'") == 0
    assert form == "run_fenced" or await store.claims.current(other) is None
