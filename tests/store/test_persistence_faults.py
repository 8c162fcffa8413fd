"""Catalogue C6 at the store: which refusals are retried, and which are the caller's."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from sessionflow.errors import StoreError
from sessionflow.models import events as ev
from store import Store
from store.db import Tx
from tests.conftest import Target
from tests.faults import Fault, injecting
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
