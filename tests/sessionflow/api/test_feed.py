"""The shared feed: one store follower per session for all its subscribers, frames that are
ready together in one write, and a window that falls back to the table for whoever it lacks."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from sessionflow.api.app import create_app
from sessionflow.api.config import ApiSettings
from sessionflow.api.feed import Feed, Frame
from sessionflow.api.serve import running_api
from sessionflow.client import SessionClient
from sessionflow.models import events as ev
from tests.conftest import Target
from tests.sessionflow.api.conftest import Api, Reader
from tests.sessionflow.api.test_guard import Proxy
from tests.sessionflow.api.test_stream import store_seqs, stream, synced


async def contexts(api: Api, sid: str, count: int, prefix: str = "k") -> None:
    """``count`` events committed in one transaction: they are ready together."""
    batch = [ev.ContextSet(session_id=sid, key=f"{prefix}{i}", text="x") for i in range(count)]
    await api.h.store.events.publish_many(batch)


async def test_one_store_follower_serves_every_subscriber_of_a_session(api: Api) -> None:
    first = await api.session([{"text": "x"}])
    second = await api.session([{"text": "y"}])
    readers = [stream(api, first) for _ in range(12)] + [stream(api, second) for _ in range(3)]
    opened = [await reader.__aenter__() for reader in readers]
    for reader in opened:
        await reader.events(synced)
    health = (await api.http.get("/healthz")).json()
    assert (health["streams"], health["followers"]) == (15, 2)
    bells = api.h.store.events.notifier._bells  # the store's followers, one doorbell each
    assert (len(bells[first]), len(bells[second])) == (1, 1)
    await contexts(api, first, 5)
    expected = await store_seqs(api, first)
    for reader in opened[:12]:
        got = await reader.events(lambda m: m.id == str(expected[-1]))
        assert [int(m.id or -1) for m in got] == expected[1:]
    for reader in readers:
        await reader.__aexit__(None, None, None)
    await api.h.until(lambda: _followers(api, 0))
    assert first not in bells and second not in bells


async def _followers(api: Api, count: int) -> bool:
    return bool((await api.http.get("/healthz")).json()["followers"] == count)


@dataclass
class Raw:
    """The ASGI messages of one response, as the server sent them (one per write)."""

    bodies: list[bytes] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    leave: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, text: bytes) -> None:
        while not any(text in body for body in self.bodies):
            self.arrived.clear()
            await self.arrived.wait()

    def writes_with(self, text: bytes) -> list[bytes]:
        return [body for body in self.bodies if text in body]


@asynccontextmanager
async def raw_stream(api: Api, sid: str) -> AsyncIterator[Raw]:
    app = create_app(api.h.client, ApiSettings())
    raw = Raw()
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"/sessions/{sid}/events",
        "raw_path": f"/sessions/{sid}/events".encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await raw.leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            raw.bodies.append(message["body"])
            raw.arrived.set()

    task = asyncio.create_task(app(scope, receive, send))
    try:
        yield raw
    finally:
        raw.leave.set()
        await task


async def test_events_ready_together_leave_in_one_write(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    await contexts(api, sid, 20, "old")
    async with raw_stream(api, sid) as raw:
        await raw.until(b"event: synced")
        (history,) = raw.writes_with(b"id: ")  # session.created and 20 more: one write
        assert history.count(b"id: ") == 21
        await contexts(api, sid, 10, "new")
        await raw.until(b'"key": "new9"')
        (live,) = raw.writes_with(b'"key": "new')  # committed together, sent together
        assert live.count(b"id: ") == 10
    sent = [int(seq) for seq in re.findall(rb"^id: (\d+)\r?$", b"".join(raw.bodies), re.M)]
    assert sent == await store_seqs(api, sid)


async def test_a_subscriber_behind_the_window_reads_the_rest_from_the_table(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    events = api.h.store.events
    start = await events.latest_sequence(sid)
    feed = Feed(events, sid, start, max_frames=3)
    try:
        await contexts(api, sid, 10)
        latest = await events.latest_sequence(sid)
        await api.h.until(lambda: feed.head == latest)
        assert feed.floor == latest - 3  # the window keeps the newest three
        batches = [batch async for batch in feed.frames(-1, through=latest)]
        seqs = [frame.seq for batch in batches for frame in batch]
        assert seqs == list(range(latest + 1)) == await store_seqs(api, sid)
        # From the table up to the window's floor, then the window: two batches.
        assert [batch[-1].seq for batch in batches] == [feed.floor, latest]
        assert all(isinstance(frame, Frame) for batch in batches for frame in batch)
    finally:
        await feed.close()


class CountedReads:
    """The event store, counting the table reads a feed makes."""

    def __init__(self, events: Any) -> None:
        self.events, self.reads = events, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)

    async def read_after(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return await self.events.read_after(*args, **kwargs)


async def test_subscribers_share_one_read_and_one_encoding_of_history(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    await contexts(api, sid, 30)
    latest = await api.h.store.events.latest_sequence(sid)
    events = CountedReads(api.h.store.events)
    feed = Feed(events, sid, latest)  # type: ignore[arg-type]  # as a first subscriber starts it
    try:

        async def history() -> list[Frame]:
            return [frame async for batch in feed.frames(-1, through=latest) for frame in batch]

        together = await asyncio.gather(*(history() for _ in range(10)))
        later = await history()  # a moment later: the page read is kept
        assert [frame.seq for frame in later] == await store_seqs(api, sid)
        assert events.reads == 1
        for frames in [*together, later]:
            assert all(mine is first for mine, first in zip(frames, later, strict=True))
    finally:
        await feed.close()


@pytest.mark.parametrize("target", ["sqlite"], indirect=True)  # the cut store is PostgreSQL
async def test_streams_end_when_the_store_fails_under_their_feed(
    api: Api, postgres_target: Target
) -> None:
    """PostgreSQL behind a proxy this test cuts: the feed fails, its streams end cleanly (an
    EventSource reconnects by itself), and the feed is gone."""
    async with Proxy(5432) as proxy:
        target = Target(
            postgres_target.url.replace(":5432/", f":{proxy.port}/"), postgres_target.schema
        )
        store = await target.open()
        # A queue no worker polls: the harness's workers write to the harness's store, and a
        # session of another store on their queue is refused (issue 32's one store).
        queue = f"{api.h.client.task_queue}-proxied"
        client = SessionClient(api.h.client.temporal, store, task_queue=queue)
        try:
            async with (
                running_api(client, ApiSettings(port=0)) as url,
                httpx.AsyncClient(base_url=url, timeout=30) as http,
            ):
                body = {"workspace": str(api.h.workspace), "model": api.h.script([])}
                sid = (await http.post("/sessions", json=body)).json()["id"]
                async with (
                    http.stream("GET", f"/sessions/{sid}/events") as one,
                    http.stream("GET", f"/sessions/{sid}/events") as two,
                ):
                    readers = [Reader(one), Reader(two)]
                    for reader in readers:
                        await reader.events(synced)
                    await proxy.cut()
                    for reader in readers:
                        assert await reader.rest() == []  # ended, nothing repeated
                assert (await http.get("/healthz")).json()["followers"] == 0
        finally:
            await store.close()
