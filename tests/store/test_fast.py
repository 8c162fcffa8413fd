"""The hot path's writers (``store.write.fast``) when the database drops, refuses or races them."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from sessionflow.errors import SequenceConflictError, StoreUnavailableError
from sessionflow.models import events as ev
from store import Store
from store.claims import Claim
from store.write.fast import PostgresWriter, SqliteWriter
from tests.conftest import Target
from tests.store.conftest import libpq, terminate_backends
from tests.store.helpers import backend_pid, count, rows, tracer, until_waiting_for

APPENDERS = 8  # more than the PostgreSQL writer holds connections
AFTER_KILL = 5  # batches each surviving appender streams after the kill


def deltas(sid: str, n: int, text: str = "tok") -> list[ev.Event]:
    return [
        ev.TextDelta(session_id=sid, assistant_message_id="msg_a", ordinal=0, delta=f"{text}{i}")
        for i in range(n)
    ]


async def claimed(store: Store, n: int = 1) -> list[tuple[str, Claim]]:
    out = []
    for i in range(n):
        sid = (await store.sessions.create("/work")).id
        out.append((sid, await store.claims.acquire(sid, f"exec_{i}", f"owner-{i}")))
    return out


async def test_appends_waiting_for_a_connection_survive_their_backends_being_killed(
    postgres_url: str, own_database: str
) -> None:
    """Catalogue C4: PostgreSQL restart mid-drain."""
    store = await Target(own_database).open()
    database = make_url(own_database).database
    writer = store.writer
    assert database is not None and isinstance(writer, PostgresWriter)
    try:
        appenders = await claimed(store, APPENDERS)
        acked: dict[str, set[str]] = {sid: set() for sid, _ in appenders}
        failed: dict[str, BaseException] = {}
        streaming: set[str] = set()
        all_streaming, killed = asyncio.Event(), asyncio.Event()

        async def stream(sid: str, claim: Claim) -> None:
            """Stream until cut off, or until a few batches went through after the kill."""
            after_kill = 0
            for batch in range(10_000):
                streaming.add(sid)
                if len(streaming) == APPENDERS:
                    all_streaming.set()
                try:
                    stored = await store.append(claim, deltas(sid, 3, f"b{batch}_"))
                except Exception as error:
                    failed[sid] = error
                    return
                acked[sid].update(event.id for event in stored)
                after_kill += killed.is_set()
                if after_kill == AFTER_KILL:
                    return

        tasks = [asyncio.create_task(stream(sid, claim)) for sid, claim in appenders]
        await all_streaming.wait()
        # Hold every claim row: the appends holding a connection block on it, and the rest
        # wait for a connection. Then the database drops every connection of the test.
        locker = await psycopg.AsyncConnection.connect(libpq(own_database))
        try:
            await locker.execute("SELECT 1 FROM session_execution FOR UPDATE")
            await asyncio.wait_for(
                _until_blocked_by(postgres_url, database, locker.info.backend_pid, writer.size), 30
            )
            dropped = await asyncio.to_thread(terminate_backends, postgres_url, database)
            killed.set()
        finally:
            await locker.close()  # killed with the others: its lock went with it
        assert dropped > writer.size
        # Every appender finishes or fails; none waits forever for a connection that is gone.
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        # A cut-off append is tried once more under its ids (catalogue C2), on a fresh
        # connection: those in flight go through, or fail saying the database is unavailable.
        for sid, error in failed.items():
            assert isinstance(error, StoreUnavailableError), repr(error)
            retried = await store.append(dict(appenders)[sid], deltas(sid, 2, "retry"))
            acked[sid].update(event.id for event in retried)
        for sid, ids in acked.items():
            stored = await rows(store, "SELECT id FROM event WHERE aggregate_id = :a", a=sid)
            assert ids <= {row[0] for row in stored}, f"an acknowledged append of {sid} is lost"
    finally:
        await store.close()


async def _until_blocked_by(admin_url: str, database: str, pid: int, n: int) -> None:
    """Wait until ``n`` backends of ``database`` wait for a lock that ``pid`` holds."""
    query = (
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = %s AND %s = ANY(pg_blocking_pids(pid))"
    )
    async with await psycopg.AsyncConnection.connect(libpq(admin_url), autocommit=True) as conn:
        while True:
            row = await (await conn.execute(query, [database, pid])).fetchone()
            if row is not None and row[0] >= n:
                return
            await asyncio.sleep(0.01)


@pytest.mark.unchecked_log  # a raw row no event model reads: the log cannot be read back
async def test_a_seq_taken_behind_the_allocator_is_a_typed_conflict(store: Store) -> None:
    """Catalogue S1 on the hot path: the unique violation is mapped, nothing is partial."""
    ((sid, claim),) = await claimed(store)
    await store.append(claim, deltas(sid, 2))
    async with store.db.write() as tx:  # a writer that bypassed the sequence row took seq 4
        await tx.conn.execute(
            sa.text(
                "INSERT INTO event (id, aggregate_id, seq, created, type, data)"
                " VALUES ('evt_intruder', :a, 4, 0, 'session.synthetic.1', '{}')"
            ),
            {"a": sid},
        )
    with pytest.raises(SequenceConflictError) as conflict:
        await store.append(claim, deltas(sid, 3))
    assert conflict.value.aggregate_id == sid
    assert await count(store, "event", "aggregate_id = :a", a=sid) == 4
    assert await store.events.latest_sequence(sid) == 2


RACES = 50
INTRUDER = (  # a writer that bypasses the sequence row: its event is evt_in_<session>
    "INSERT INTO event (id, aggregate_id, seq, created, type, data)"
    " VALUES ({id}, {a}, {k}, 0, 'session.synthetic.1', '{{}}')"
)


@pytest.mark.unchecked_log  # a raw row no event model reads: the log cannot be read back
async def test_a_bypassing_writer_and_a_claimed_append_racing_for_one_seq_leave_one_winner(
    store: Store, target: Target
) -> None:
    """Catalogue S1, the two writers at once: each round a writer that bypasses the sequence
    row (a raw connection in a thread of its own) and a claimed append of 3 events start
    together, at a barrier, both after seq k of a fresh session. Exactly one wins seq k: when
    the append loses it raises the typed ``SequenceConflictError`` and writes nothing, its
    session's sequence unchanged; when the intruder loses its insert is refused (unique)."""
    rng = random.Random(1)
    for sid, claim in await claimed(store, RACES):
        await store.append(claim, deltas(sid, 2))
        k = await store.events.latest_sequence(sid) + 1
        barrier = threading.Barrier(2)
        # A random head start of up to a few ms for either side lets either writer reach
        # seq k first (woken from a thread, the append alone would nearly always win).
        head_start = rng.uniform(-0.004, 0.004)
        intruder = asyncio.create_task(
            asyncio.to_thread(_intrude, target, sid, k, barrier, max(0.0, head_start))
        )
        await asyncio.to_thread(barrier.wait)
        await asyncio.sleep(max(0.0, -head_start))
        try:
            await store.append(claim, deltas(sid, 3))
            appended = True
        except SequenceConflictError as conflict:
            assert conflict.aggregate_id == sid
            appended = False
        intruded = await intruder
        assert appended != intruded, f"round {sid}: appended={appended}, intruded={intruded}"
        taken = await rows(
            store, "SELECT id FROM event WHERE aggregate_id = :a AND seq = :k", a=sid, k=k
        )
        assert (taken[0][0] == f"evt_in_{sid}") == intruded
        assert await count(store, "event", "aggregate_id = :a", a=sid) == k + (3 if appended else 1)
        assert await store.events.latest_sequence(sid) == (k + 2 if appended else k - 1)


def _intrude(target: Target, sid: str, k: int, barrier: threading.Barrier, pause: float) -> bool:
    """Insert seq ``k`` of ``sid`` behind the allocator once both writers are at the barrier;
    whether it committed."""
    if target.backend == "sqlite":
        path = make_url(target.url).database
        assert path is not None
        with closing(sqlite3.connect(path, timeout=10, isolation_level=None)) as lite:
            barrier.wait()
            time.sleep(pause)
            try:
                lite.execute("BEGIN IMMEDIATE")
                lite.execute(INTRUDER.format(id="?", a="?", k=k), (f"evt_in_{sid}", sid))
                lite.execute("COMMIT")
            except sqlite3.IntegrityError as taken:
                assert "seq" in str(taken), taken  # refused for the seq, not anything else
                return False
            return True
    options = f"-c search_path={target.schema}" if target.schema else ""
    with psycopg.connect(libpq(target.url), options=options, autocommit=True) as conn:
        barrier.wait()
        time.sleep(pause)
        try:
            conn.execute(INTRUDER.format(id="%s", a="%s", k=k), (f"evt_in_{sid}", sid))
        except psycopg.errors.UniqueViolation as taken:
            assert "seq" in str(taken), taken
            return False
        return True


@pytest.mark.parametrize("first", ["intruder", "claimed"])
async def test_a_bypassing_writer_and_a_claimed_write_in_flight_together_leave_one_winner(
    postgres_target: Target, first: str
) -> None:
    """Catalogue S1 with both transactions open at once (PostgreSQL, where writers overlap):
    the first holds seq k uncommitted while the second's insert of seq k waits for it on the
    unique index; then the first commits. A claimed hot-path append that waited behind the
    intruder raises ``SequenceConflictError`` and writes nothing; an intruder that waited behind
    a claimed fenced transaction is refused (unique violation) and the claimed events stand."""
    store = await postgres_target.open()
    rogue = await postgres_target.open()
    try:
        ((sid, claim),) = await claimed(store)
        await store.append(claim, deltas(sid, 2))
        k = await store.events.latest_sequence(sid) + 1
        insert = sa.text(INTRUDER.format(id="'evt_in_' || :a", a=":a", k=k))
        if first == "intruder":
            async with rogue.db.write() as tx:
                await tx.conn.execute(insert, {"a": sid})
                pid = await backend_pid(tx)
                second = asyncio.create_task(store.append(claim, deltas(sid, 3)))
                await until_waiting_for(store, pid)
            with pytest.raises(SequenceConflictError):
                await second
            assert await count(store, "event", "aggregate_id = :a", a=sid) == k + 1
            assert await store.events.latest_sequence(sid) == k - 1
        else:
            async with store.claims.fenced(claim) as tx:
                for event in deltas(sid, 3):
                    await store.events.publish(event, tx=tx)
                pid = await backend_pid(tx)

                async def intrude() -> None:
                    async with rogue.db.write() as rogue_tx:
                        await rogue_tx.conn.execute(insert, {"a": sid})

                second = asyncio.create_task(intrude())
                await until_waiting_for(store, pid)
            with pytest.raises(sa.exc.IntegrityError):
                await second
            taken = await rows(store, "SELECT id FROM event WHERE aggregate_id = :a", a=sid)
            assert f"evt_in_{sid}" not in {row[0] for row in taken}
            assert await store.events.latest_sequence(sid) == k + 2
    finally:
        await rogue.close()
        await store.close()


async def test_a_cancelled_sqlite_append_waiting_for_another_process_is_never_unannounced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S11: The writer-thread fallback: a cancelled append either does not commit, or commits and
    is announced before the cancellation completes; it never commits later."""
    path = tmp_path / "cancel.db"
    begun, trace = tracer("BEGIN IMMEDIATE")
    connect = SqliteWriter._connect

    def traced(writer: SqliteWriter, busy_timeout_ms: int) -> sqlite3.Connection:
        conn = connect(writer, busy_timeout_ms)
        if busy_timeout_ms:  # the writer thread's connection, which waits for the lock
            conn.set_trace_callback(trace)
        return conn

    monkeypatch.setattr(SqliteWriter, "_connect", traced)
    store = await Target(f"sqlite+aiosqlite:///{path}").open()
    try:
        ((sid, claim),) = await claimed(store)
        heard: list[int] = []
        store.events.listen(lambda event: heard.append(event.seq))
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        task = asyncio.create_task(store.append(claim, deltas(sid, 3, "cancelled")))
        await begun.wait()  # it went to the writer thread, which waits for the lock
        assert not task.done()
        task.cancel()
        await asyncio.sleep(0)
        blocker.execute("COMMIT")  # the lock frees while the cancellation is under way
        blocker.close()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled = _seqs(path, sid, "cancelled")
        assert cancelled in ([], [1, 2, 3])
        assert heard == cancelled, "committed but never announced"
        after = await store.append(claim, deltas(sid, 2, "after"))
        assert [e.seq for e in after] == [len(cancelled) + 1, len(cancelled) + 2]
    finally:
        await store.close()  # after whatever the writer thread still had to do
    assert _seqs(path, sid, "cancelled") == cancelled, "committed after it was cancelled"
    assert heard == [*cancelled, *(e.seq for e in after)]


def _seqs(path: Path, sid: str, text: str) -> list[int]:
    """The seqs of the session's deltas whose text starts with ``text``, read with sqlite3."""
    with closing(sqlite3.connect(path)) as conn:
        found = conn.execute(
            "SELECT seq FROM event WHERE aggregate_id = ? AND data LIKE ? ORDER BY seq",
            (sid, f'%"delta":"{text}%'),
        )
        return [row[0] for row in found]
