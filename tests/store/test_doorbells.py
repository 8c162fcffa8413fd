"""What a PostgreSQL follower relies on, and what it does not: catalogue S6, S7, D3 and D7."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy.engine import make_url

import store.notify
from sessionflow.errors import InvalidIdError
from sessionflow.ids import validate_id
from store.dialect import NOTIFY_CHANNEL
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.conftest import libpq
from tests.store.helpers import Probe, rows
from tests.store.procs import appender, spawn

HOUR = 3600.0  # a poll interval no test waits out: an event can only come by a doorbell


async def test_a_follower_whose_listener_is_killed_catches_up_then_hears_live_events_again(
    postgres_url: str, own_database: str
) -> None:
    """S6: the listener connection killed with ``pg_terminate_backend``. The followers poll
    once an hour, so every event they get after their history comes by a doorbell. A warm-up
    event to another session shows the first listener live. Then the listener is killed while
    the database refuses new connections, and 10 events are committed to the followed session
    (their NOTIFY heard by no one, and no ring of that session pending) before it may reconnect:
    once it does, the follower catches up from its last seq; then 10 more events reach it only
    through the reconnected LISTEN. Every seq arrives once, in order; the listener is a new
    backend."""
    database = make_url(own_database).database
    follower, writer = await Target(own_database).open(), await Target(own_database).open()
    for store_ in (follower, writer):
        store_.events.registry.register(Probe)
    followed, warm = _Followed(follower, "ses_s6"), _Followed(follower, "ses_warm")

    async def publish(aggregate: str, values: range) -> None:
        for value in values:
            await writer.events.publish(Probe(session_id=aggregate, value=value))

    try:
        await asyncio.wait_for(_until(lambda: followed.synced and warm.synced), 30)
        await publish("ses_warm", range(1))
        await warm.until(0)  # live through the first listener
        killed = follower.notifier.listener_pid
        with psycopg.connect(libpq(postgres_url), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
            admin.execute("SELECT pg_terminate_backend(%s)", [killed])
            await asyncio.wait_for(_until(lambda: follower.notifier.reconnects >= 1), 30)
            await publish("ses_s6", range(10))  # the writer's and announcer's connections stay
            assert followed.received == []
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await followed.until(9)  # the catch-up, rung by the reconnection
        assert follower.notifier.listener_pid not in (None, killed)
        await publish("ses_s6", range(10, 20))
        await followed.until(19)  # live again, through the new listener only
    finally:
        await followed.stop()
        await warm.stop()
        await follower.close()
        await writer.close()
    assert followed.received == list(range(20))


class _Followed:
    """A follower of one aggregate (polling once an hour), and the seqs it received."""

    def __init__(self, store_: store.Store, aggregate: str) -> None:
        self.received: list[int] = []
        self.synced = False
        self._arrived = asyncio.Condition()
        self._task = asyncio.create_task(self._follow(store_, aggregate))

    async def _follow(self, store_: store.Store, aggregate: str) -> None:
        async for item in store_.events.log(aggregate, follow=True, poll_interval=HOUR):
            if isinstance(item, StoredEvent):
                async with self._arrived:
                    self.received.append(item.seq)
                    self._arrived.notify_all()
            else:
                self.synced = True

    async def until(self, seq: int) -> None:
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: seq in self.received), 30)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


async def test_a_follower_that_hears_no_notification_gets_every_event_by_polling(
    postgres_target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S7: NOTIFY suppressed entirely. The follower's listener listens on a channel nobody
    notifies, while another process appends; polling alone delivers every event, in order,
    once."""
    monkeypatch.setattr(store.notify, "NOTIFY_CHANNEL", "sessionflow_nobody_rings")
    follower_store = await postgres_target.open()
    follower_store.events.registry.register(Probe)
    total, received = 120, []
    try:

        async def follow() -> None:
            log = follower_store.events.log("ses_deaf", follow=True, poll_interval=0.05)
            async for item in log:
                if isinstance(item, StoredEvent):
                    received.append(item.seq)
                    if item.seq == total - 1:
                        return

        following = asyncio.create_task(follow())
        process = spawn(appender, postgres_target, "ses_deaf", total, 10)
        await asyncio.wait_for(following, 60)
        await asyncio.to_thread(process.join, 30)
    finally:
        await follower_store.close()
    assert received == list(range(total))


async def test_a_notification_carries_an_id_and_a_seq_never_a_payload(
    own_database: str,
) -> None:
    """D7: PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more. A notification names
    the aggregate and a seq and nothing of the event, so even the longest valid session id (128
    characters, ``sessionflow.ids``) and a large event ring the bell with a short payload. On a
    database of its own: other tests notify on the same channel in the shared one."""
    sid = "s" * 128
    validate_id(sid)
    with pytest.raises(ValueError):
        validate_id(sid + "s")  # the id bound is what bounds the payload
    writer = await Target(own_database).open()
    writer.events.registry.register(Probe)
    try:
        async with await psycopg.AsyncConnection.connect(
            libpq(own_database), autocommit=True
        ) as listener:
            await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            await writer.events.publish(Probe(session_id=sid, value=1 << 62))
            async for note in listener.notifies(timeout=30):
                payload = note.payload
                break
    finally:
        await writer.close()
    assert payload.split()[0] == sid, payload
    assert all(part.isdigit() for part in payload.split()[1:]), payload
    assert len(payload.encode()) < 200


HOSTILE_ID = "x\"; LISTEN y; NOTIFY y, 'z'; --"


async def test_every_notification_rings_one_fixed_channel_with_the_id_in_its_payload(
    own_database: str,
) -> None:
    """D3: the NOTIFY channel is never built from an id. An event whose aggregate id is
    hostile (it quotes, LISTENs and NOTIFYs another channel) is refused before anything is
    written; handed to the announcer all the same, that id rings the fixed channel, whole in the
    payload, as the longest valid session id does. A listener on the channel the hostile id
    names hears only the test's own later NOTIFY: notifications arrive in commit order, so
    nothing of the store's reached it."""
    longest = "s" * 128
    writer = await Target(own_database).open()
    writer.events.registry.register(Probe)
    try:
        async with (
            await psycopg.AsyncConnection.connect(libpq(own_database), autocommit=True) as fixed,
            await psycopg.AsyncConnection.connect(libpq(own_database), autocommit=True) as named,
        ):
            await fixed.execute(f"LISTEN {NOTIFY_CHANNEL}")
            await named.execute("LISTEN y")
            with pytest.raises(InvalidIdError):
                await writer.events.publish(Probe(session_id=HOSTILE_ID, value=1))
            assert writer.notifier.announcer is not None
            writer.notifier.announcer.announce(HOSTILE_ID, 1)  # as if it had got through
            await writer.events.publish(Probe(session_id=longest, value=2))
            heard = {}
            async for note in fixed.notifies(timeout=30):
                heard[note.payload.rpartition(" ")[0]] = note.channel
                if len(heard) == 2:
                    break
            await fixed.execute("SELECT pg_notify('y', 'sentinel')")
            first = [note.payload async for note in named.notifies(timeout=30, stop_after=1)]
        written = await rows(
            writer, "SELECT count(*) FROM event WHERE aggregate_id <> :a", a=longest
        )
    finally:
        await writer.close()
    assert heard == {HOSTILE_ID: NOTIFY_CHANNEL, longest: NOTIFY_CHANNEL}
    assert first == ["sentinel"]
    assert written == [(0,)]
