"""``Store.append``: the fenced hot path for token deltas, and its fallback to the general path."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from sessionflow.errors import ClaimLostError, StaleAttemptError
from sessionflow.models import events as ev
from store import Store
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.helpers import count, rows


async def claimed(store: Store) -> tuple[str, object]:
    sid = (await store.sessions.create("/work")).id
    return sid, await store.claims.acquire(sid, "exec_a", "owner-a")


def deltas(sid: str, n: int, text: str = "tok") -> list[ev.Event]:
    return [
        ev.TextDelta(session_id=sid, assistant_message_id="msg_a", ordinal=0, delta=f"{text}{i}")
        for i in range(n)
    ]


async def test_deltas_append_gap_free_stamped_and_announced(store: Store) -> None:
    sid, claim = await claimed(store)
    heard: list[int] = []
    store.events.listen(lambda event: heard.append(event.seq))
    first = await store.append(claim, deltas(sid, 3))  # type: ignore[arg-type]
    second = await store.append(claim, deltas(sid, 1))  # type: ignore[arg-type]
    assert [e.seq for e in first + second] == [1, 2, 3, 4] == heard
    stored = await rows(
        store, "SELECT seq, execution_id, epoch FROM event WHERE seq > 0 ORDER BY seq"
    )
    assert stored == [(seq, "exec_a", 1) for seq in (1, 2, 3, 4)]
    page = await store.events.read_after(sid, 0)
    assert [e.data.delta for e in page.events] == ["tok0", "tok1", "tok2", "tok0"]  # type: ignore[attr-defined]


async def test_a_lost_claim_refuses_the_append_and_writes_nothing(store: Store) -> None:
    """Catalogue F5: an expired claim never renews itself."""
    sid, claim = await claimed(store)
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql("UPDATE session_execution SET expires_at = 0")
    with pytest.raises(ClaimLostError, match="lease expired"):
        await store.append(claim, deltas(sid, 5))  # type: ignore[arg-type]
    assert await count(store, "event") == 1
    assert await store.events.latest_sequence(sid) == 0


async def test_an_older_step_attempt_is_refused(store: Store) -> None:
    sid, claim = await claimed(store)
    await store.append(claim, deltas(sid, 1), step_attempt=3)  # type: ignore[arg-type]
    with pytest.raises(StaleAttemptError):
        await store.append(claim, deltas(sid, 1), step_attempt=2)  # type: ignore[arg-type]
    assert await store.events.latest_sequence(sid) == 1


@pytest.mark.unsettled  # it ends inside a busy period
async def test_projected_events_take_the_general_path(store: Store) -> None:
    sid, claim = await claimed(store)
    batch: list[ev.Event] = [
        ev.StepStarted(
            session_id=sid,
            assistant_message_id="msg_a",
            agent="build",
            model=ev.ModelRef(provider_id="p", id="m"),
        ),
        ev.TextStarted(session_id=sid, assistant_message_id="msg_a", ordinal=0),
        *deltas(sid, 2),
        ev.TextEnded(session_id=sid, assistant_message_id="msg_a", ordinal=0, text="tok0tok1"),
    ]
    stored = await store.append(claim, batch)  # type: ignore[arg-type]
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    (message,) = await store.sessions.messages(sid)
    assert message.content[0].text == "tok0tok1"  # type: ignore[union-attr]


async def test_a_follower_sees_hot_path_events_live(store: Store) -> None:
    sid, claim = await claimed(store)
    received: list[int] = []

    async def follow() -> None:
        async for item in store.events.log(sid, follow=True, poll_interval=30):
            if isinstance(item, StoredEvent):
                received.append(item.seq)
                if item.seq == 20:
                    return

    task = asyncio.create_task(follow())
    for _ in range(10):
        await store.append(claim, deltas(sid, 2))  # type: ignore[arg-type]
    await asyncio.wait_for(task, 10)
    assert received == list(range(21))


async def test_sqlite_append_waits_for_another_processes_write_lock(tmp_path: Path) -> None:
    """S11: Only SQLite has the writer-thread fallback: its inline connection never waits."""
    path = tmp_path / "locked.db"
    store = await Target(f"sqlite+aiosqlite:///{path}").open()
    sid, claim = await claimed(store)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    task = asyncio.create_task(store.append(claim, deltas(sid, 3)))  # type: ignore[arg-type]
    await asyncio.sleep(0.3)
    assert not task.done()
    blocker.execute("COMMIT")
    blocker.close()
    assert [e.seq for e in await asyncio.wait_for(task, 10)] == [1, 2, 3]
    await store.close()
