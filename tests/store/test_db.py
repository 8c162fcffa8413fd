"""Transactions and migrations (``store.db``) against what the database does to them."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Awaitable, Callable

import psycopg
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from sessionflow.errors import TransactionConflictError
from sessionflow.models import events as ev
from store import Store, open_store
from store.claims import Claim
from store.db import SCHEMA_HEAD, Database, Tx, migration_config
from tests.conftest import StoreFactory, Target
from tests.store.conftest import libpq
from tests.store.helpers import count

OPENERS = 6
ROUNDS = 5


@pytest.mark.breaks_invariants("I4")  # its events are published unclaimed
async def test_a_write_cancelled_at_its_commit_commits_announced_or_not_at_all(
    open_test_store: StoreFactory, target: Target
) -> None:
    """S11: On SQLite the write takes the aiosqlite fallback (another process holds the lock)."""
    store = await open_test_store()
    sid = (await store.sessions.create("/work")).id
    heard: list[int] = []
    store.events.listen(lambda event: heard.append(event.seq))
    blocker = _holding_the_sqlite_lock(target)

    async def cancel_at_commit(tx: Tx) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # delivered at the commit's first wait

    async def write() -> None:
        async with store.db.write() as tx:
            await store.events.publish(ev.Synthetic(session_id=sid, text="cancelled"), tx=tx)
            tx.before_commit.append(cancel_at_commit)

    task = asyncio.create_task(write())
    if blocker is not None:
        await asyncio.sleep(0.1)  # the write began on the fallback path, waiting for the lock
        blocker.execute("COMMIT")
        blocker.close()
    with pytest.raises(asyncio.CancelledError):
        await task
    committed = await count(store, "event", "aggregate_id = :a AND seq > 0", a=sid)
    assert heard == ([1] if committed else []), "committed but never announced"
    await store.events.publish(ev.Synthetic(session_id=sid, text="after"))
    assert await count(store, "event", "aggregate_id = :a AND seq > 0", a=sid) == committed + 1


def _holding_the_sqlite_lock(target: Target) -> sqlite3.Connection | None:
    if target.backend != "sqlite":
        return None
    database = make_url(target.url).database
    assert database is not None
    blocker = sqlite3.connect(database, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    return blocker


async def test_engines_opening_one_fresh_schema_at_once_all_succeed(postgres_url: str) -> None:
    for _ in range(ROUNDS):
        schema = f"t_fresh_{uuid.uuid4().hex[:12]}"
        databases = [Database(postgres_url, schema=schema) for _ in range(OPENERS)]
        try:
            await asyncio.gather(*(db.migrate() for db in databases))
        finally:
            for db in databases:
                await db.dispose()
            with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_admissions_stay_read_committed_when_the_database_default_is_not(
    own_database: str,
) -> None:
    """Catalogue S12: isolation assumptions."""
    with psycopg.connect(libpq(own_database), autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(
            f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = 'repeatable read'"
        )
    store = await open_store(own_database)
    try:
        sid = (await store.sessions.create("/work")).id
        receipts = await asyncio.gather(*(store.inputs.admit(sid, f"p{i}") for i in range(20)))
        assert sorted(r.admitted_seq for r in receipts) == list(range(1, 21))
        claim = await store.claims.acquire(sid, "exec_a", "owner-a")
        batches = await asyncio.gather(
            *(
                store.append(
                    claim,
                    [ev.TextDelta(session_id=sid, assistant_message_id="m", ordinal=0, delta="x")],
                )
                for _ in range(20)
            )
        )
        assert sorted(b[0].seq for b in batches) == list(range(21, 41))
    finally:
        await store.close()


async def test_every_connection_is_pinned_to_read_committed(own_database: str) -> None:
    """Catalogue S12: isolation assumptions."""
    with psycopg.connect(libpq(own_database), autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(
            f"ALTER DATABASE \"{database}\" SET default_transaction_isolation = 'serializable'"
        )
    store: Store = await open_store(own_database)
    try:
        async with store.db.read() as read:
            level = (await read.exec_driver_sql("SHOW transaction_isolation")).scalar_one()
        async with await psycopg.AsyncConnection.connect(store.db.psycopg_conninfo) as raw:
            row = await (await raw.execute("SHOW transaction_isolation")).fetchone()
        assert (level, row) == ("read committed", ("read committed",))
    finally:
        await store.close()


# A fault injector in the database itself (catalogue C6): once armed, the next ``failures``
# event rows inserted raise ``sqlstate``, aborting their transaction as the database would.
FAULTS = """
CREATE SEQUENCE fault_count;
CREATE TABLE fault_plan (failures bigint NOT NULL, sqlstate text NOT NULL);
INSERT INTO fault_plan VALUES (0, '40001');
CREATE FUNCTION inject_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE plan fault_plan;
BEGIN
  SELECT * INTO plan FROM fault_plan;
  IF nextval('fault_count') <= plan.failures THEN
    RAISE EXCEPTION 'injected fault' USING ERRCODE = plan.sqlstate;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER inject_fault BEFORE INSERT ON event FOR EACH ROW EXECUTE FUNCTION inject_fault();
"""


async def faulty_store(target: Target) -> tuple[Store, str, Claim]:
    store = await target.open()
    sid = (await store.sessions.create("/work")).id
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql(FAULTS)
    return store, sid, claim


async def arm(store: Store, failures: int, sqlstate: str) -> None:
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql(
            "UPDATE fault_plan SET failures = %(n)s, sqlstate = %(code)s",
            {"n": failures, "code": sqlstate},
        )
        await tx.conn.exec_driver_sql("SELECT setval('fault_count', 1, false)")


def writes(store: Store, sid: str, claim: Claim) -> list[Callable[[], Awaitable[object]]]:
    """A write each way into the store: its own transaction, the hot path, the fenced path."""
    delta = ev.TextDelta(session_id=sid, assistant_message_id="m", ordinal=0, delta="x")
    return [
        lambda: store.events.publish(ev.Synthetic(session_id=sid, text="p")),
        lambda: store.append(claim, [delta]),
        lambda: store.append(claim, [ev.Synthetic(session_id=sid, text="f")]),
    ]


@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
async def test_serialization_failures_and_deadlocks_are_retried(
    postgres_target: Target, sqlstate: str
) -> None:
    """Catalogue C6: persistence chaos."""
    store, sid, claim = await faulty_store(postgres_target)
    try:
        for write in writes(store, sid, claim):
            await arm(store, 2, sqlstate)
            await write()  # the first two attempts are aborted, the third commits
        assert await store.events.latest_sequence(sid) == 3
    finally:
        await store.close()


async def test_a_conflict_that_persists_is_a_typed_error_and_writes_nothing(
    postgres_target: Target,
) -> None:
    """Catalogue C6: persistence chaos."""
    store, sid, claim = await faulty_store(postgres_target)
    try:
        await arm(store, 1_000_000, "40001")
        for write in writes(store, sid, claim):
            with pytest.raises(TransactionConflictError) as conflict:
                await write()
            assert (conflict.value.sqlstate, conflict.value.attempts) == ("40001", 5)
            assert "Retry the operation" in str(conflict.value)
        assert await store.events.latest_sequence(sid) == 0
    finally:
        await store.close()


def test_the_schema_head_the_store_opens_at_is_alembics_head() -> None:
    assert ScriptDirectory.from_config(migration_config()).get_heads() == [SCHEMA_HEAD]
