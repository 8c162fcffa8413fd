"""PostgreSQL's doorbell to other processes: NOTIFY after the commit, never for a refused write;
and the connections a store opens (pools of their own for renewals, bounded in number)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionflow.errors import ClaimLostError
from sessionflow.models import events as ev
from store import Store
from store.dialect import NOTIFY_CHANNEL
from store.events import StoredEvent
from store.notify import Announcer, Doorbell
from tests.conftest import Target
from tests.store.conftest import libpq


def deltas(sid: str, n: int) -> list[ev.Event]:
    return [
        ev.TextDelta(session_id=sid, assistant_message_id="msg_a", ordinal=0, delta=f"tok{i}")
        for i in range(n)
    ]


async def listening(url: str) -> psycopg.AsyncConnection[Any]:
    conn = await psycopg.AsyncConnection.connect(libpq(url), autocommit=True)
    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return conn


async def notes_until(
    conn: psycopg.AsyncConnection[Any], payload: str
) -> AsyncIterator[psycopg.Notify]:
    """The notifications on the channel, up to and including the one carrying ``payload``."""
    async for note in conn.notifies():
        yield note
        if note.payload == payload:
            return


@pytest.fixture
async def own_store(own_database: str) -> AsyncIterator[Store]:
    # A database of its own: NOTIFY reaches every listener of a database, and other tests
    # (other engineers' too) notify on the same channel in the shared one.
    store = await Target(own_database).open()
    yield store
    await store.close()


async def test_a_fenced_out_append_sends_no_notification(
    own_store: Store, own_database: str
) -> None:
    store = own_store
    sid = (await store.sessions.create("/work")).id
    lost = await store.claims.acquire(sid, "exec_1", "owner-1")
    await store.claims.release(lost)
    listener = await listening(own_database)
    try:
        with pytest.raises(ClaimLostError):
            await store.append(lost, deltas(sid, 3))
        claim = await store.claims.acquire(sid, "exec_2", "owner-2")
        stored = await store.append(claim, deltas(sid, 3))
        final = f"{sid} {stored[-1].seq}"
        payloads = [note.payload async for note in notes_until(listener, final)]
    finally:
        await listener.close()
    # Every notification names the session and a committed seq: none is empty (the refused
    # append's), and the seqs only grow (rings coalesce per aggregate, in commit order).
    assert all(p.startswith(f"{sid} ") for p in payloads), payloads
    seqs = [int(p.removeprefix(f"{sid} ")) for p in payloads]
    assert seqs == sorted(seqs) and seqs[-1] == stored[-1].seq


@pytest.mark.parametrize("path", ["hot", "projected"])
async def test_notifications_are_sent_after_the_commit_by_the_announcer(
    own_store: Store, own_database: str, path: str
) -> None:
    store = own_store
    sid = (await store.sessions.create("/work")).id
    claim = await store.claims.acquire(sid, "exec_1", "owner-1")
    listener = await listening(own_database)
    try:
        if path == "hot":
            stored = await store.append(claim, deltas(sid, 2))
        else:
            renamed = ev.SessionRenamed(session_id=sid, title="renamed")
            stored = await store.append(claim, [renamed, *deltas(sid, 1)])
        final = f"{sid} {stored[-1].seq}"
        notes = [note async for note in notes_until(listener, final)]
    finally:
        await listener.close()
    announcer = store.notifier.announcer
    assert announcer is not None and announcer.pid is not None
    # Sent by the announcer's own connection, once the write had committed: never from inside
    # a write transaction, which would hold PostgreSQL's notify lock through its commit.
    assert {note.pid for note in notes} == {announcer.pid}
    assert (await store.events.latest_sequence(sid)) == stored[-1].seq


async def test_rings_within_the_gap_after_a_send_go_out_together(own_database: str) -> None:
    """A busy worker's commits share sends: after one, what rings within the gap waits and goes
    in one statement, each aggregate with its latest seq; the first ring of a quiet spell goes
    at once."""
    announcer = Announcer(libpq(own_database), gap=2.0)
    listener = await listening(own_database)
    try:
        announcer.announce("ses_a", 1)
        first = [note.payload async for note in notes_until(listener, "ses_a 1")]
        for seq in (2, 3):
            announcer.announce("ses_a", seq)
            await asyncio.sleep(0.02)  # time for a send, were the sender free to make one
        announcer.announce("ses_b", 7)
        rest: set[str] = set()
        async for note in listener.notifies():
            rest.add(note.payload)
            if {"ses_a 3", "ses_b 7"} <= rest:
                break
    finally:
        await listener.close()
        await announcer.close()
    assert first == ["ses_a 1"]
    # One statement after the gap, not one per ring: "ses_a 2" was never sent.
    assert rest == {"ses_a 3", "ses_b 7"}


async def test_a_send_whose_connection_was_closed_is_sent_again_at_once(
    own_database: str,
) -> None:
    """Issue 25 (3): the announcer dropped a batch whose NOTIFY failed on a closed connection,
    and a follower in another process waited for its poll (about 600 ms). It resends once on a
    fresh connection, so the notification arrives; and when the server refuses it too, the
    rings wait for the next send."""
    announcer = Announcer(libpq(own_database), gap=0.0)
    listener = await listening(own_database)
    try:
        announcer.announce("ses_a", 1)
        assert [n.payload async for n in notes_until(listener, "ses_a 1")] == ["ses_a 1"]
        first = announcer.pid
        async with await psycopg.AsyncConnection.connect(libpq(own_database)) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", [first])
        announcer.announce("ses_a", 2)
        async with asyncio.timeout(30):  # dropped, it would never come (nobody polls here)
            assert [n.payload async for n in notes_until(listener, "ses_a 2")] == ["ses_a 2"]
        assert announcer.pid != first  # a fresh connection sent it
    finally:
        await listener.close()
        await announcer.close()


async def test_rings_a_refused_send_did_not_deliver_go_with_the_next(
    own_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    announcer = Announcer(libpq(own_database), gap=0.0)
    good = announcer._conninfo
    announcer._conninfo = "host=127.0.0.1 port=1 connect_timeout=1"  # the server is away
    listener = await listening(own_database)
    try:
        announcer.announce("ses_a", 1)
        async with asyncio.timeout(30):  # a send and its retry failed: the ring waits
            while not any("Could not notify" in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.01)
        announcer._conninfo = good  # the server is back
        async with asyncio.timeout(30):
            assert [n.payload async for n in notes_until(listener, "ses_a 1")] == ["ses_a 1"]
    finally:
        await listener.close()
        await announcer.close()


async def test_a_claim_renewal_does_not_wait_for_a_busy_pool(
    own_database: str,
) -> None:
    store = await Target(own_database).open(db_pool_size=1, db_pool_overflow=0)
    try:
        sid = (await store.sessions.create("/work")).id
        claim = await store.claims.acquire(sid, "exec_1", "owner-1")
        # Every connection of the main pool is taken (held open here) while the renewal runs.
        async with store.db.write() as tx:
            await tx.conn.exec_driver_sql("SELECT 1")
            renewed = await store.claims.renew(claim)
        assert renewed.expires_at >= claim.expires_at
    finally:
        await store.close()


async def test_a_busy_worker_process_stays_well_under_the_connection_limit(
    own_store: Store, own_database: str
) -> None:
    store = own_store
    sessions = [(await store.sessions.create("/work")).id for _ in range(40)]
    claims = [
        await store.claims.acquire(sid, f"exec_{i}", f"owner-{i}") for i, sid in enumerate(sessions)
    ]

    async def busy(sid: str, claim: Any) -> None:
        for _ in range(3):
            await store.append(claim, deltas(sid, 2))
            await store.append(claim, [ev.SessionRenamed(session_id=sid, title="t")])
            await store.claims.renew(claim)
            await store.sessions.get(sid)

    await asyncio.gather(*(busy(sid, claim) for sid, claim in zip(sessions, claims, strict=True)))
    async with await psycopg.AsyncConnection.connect(libpq(own_database)) as admin:
        cursor = await admin.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        row = await cursor.fetchone()
    assert row is not None
    # The pools' bounds (store.db.Pools) and the hot path's, LISTEN and NOTIFY: 28 at most.
    assert row[0] <= 28


async def test_a_doorbell_wait_cancelled_as_it_rings_is_cancelled() -> None:
    """A follower stopped at the moment its doorbell rings stops. (On Python 3.11,
    ``asyncio.wait_for`` returned the ring and lost the cancellation, so a stopped feed
    followed on forever: its ``close`` never returned.)"""
    bell = Doorbell()
    waiting = asyncio.create_task(bell.wait(60))
    await asyncio.sleep(0)  # the task waits for the ring
    bell.ring()
    waiting.cancel()  # in the same loop iteration as the ring
    with pytest.raises(asyncio.CancelledError):
        await waiting


def test_product_code_never_uses_asyncio_wait_for() -> None:
    """``asyncio.timeout`` instead: ``wait_for`` loses a cancellation that arrives as its
    awaitable completes (Python 3.11), which is how a stopped task goes on forever."""
    root = Path(__file__).parents[2]
    found = [
        f"{path.relative_to(root)}:{n}"
        for package in ("activities", "store", "sessionflow", "workflows")
        for path in (root / package).rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "asyncio.wait_for(" in line
    ]
    assert found == []


async def test_a_store_closed_right_after_its_commit_still_rings_other_processes(
    own_database: str,
) -> None:
    """A process that commits and closes its store at once (a CLI call admitting a prompt)
    still tells the followers of other processes: a follower polling once an hour gets both
    events, which only the notifications can bring it, the second's sent by the close."""
    follower, writer = await Target(own_database).open(), await Target(own_database).open()
    received: list[int] = []
    synced = asyncio.Event()

    async def follow(sid: str) -> None:
        async for item in follower.events.log(sid, follow=True, poll_interval=3600):
            if not isinstance(item, StoredEvent):
                synced.set()  # the history (session.created) is delivered
            elif synced.is_set():
                received.append(item.seq)
                if len(received) == 2:
                    return

    try:
        sid = (await writer.sessions.create("/work")).id
        following = asyncio.create_task(follow(sid))
        await asyncio.wait_for(synced.wait(), 30)
        listening_since = follower.notifier.reconnects
        # Two commits in a row: the second's ring waits out the gap after the first's send.
        seqs = [
            (await writer.events.publish(ev.Synthetic(session_id=sid, text=t))).seq for t in "ab"
        ]
        await writer.close()  # at once: the second's send is still to come
        await asyncio.wait_for(following, 30)
    finally:
        await follower.close()
    assert received == seqs
    assert follower.notifier.reconnects == listening_since  # not a reconnection's ring
