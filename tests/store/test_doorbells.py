"""What a PostgreSQL follower relies on, and what it does not: catalogue S7 and D7."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

import store.notify
from sessionflow.ids import validate_id
from store.dialect import NOTIFY_CHANNEL
from store.events import StoredEvent
from tests.conftest import Target, _libpq
from tests.store.helpers import Probe
from tests.store.procs import appender, spawn


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
    postgres_target: Target,
) -> None:
    """D7: PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more. A notification names
    the aggregate and a seq and nothing of the event, so even the longest valid session id (128
    characters, ``sessionflow.ids``) and a large event ring the bell with a short payload."""
    sid = "s" * 128
    validate_id(sid)
    with pytest.raises(ValueError):
        validate_id(sid + "s")  # the id bound is what bounds the payload
    writer = await postgres_target.open()
    writer.events.registry.register(Probe)
    try:
        async with await psycopg.AsyncConnection.connect(
            _libpq(postgres_target.url), autocommit=True
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
