"""The SSE stream over real HTTP: history then live, resumption by Last-Event-ID, many, slow and
departing subscribers. Every seq list is compared with the store's own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.api.config import ApiSettings
from sessionflow.api.feed import KEPT_PAGE_BYTES, WINDOW_BYTES, WINDOW_FRAMES
from sessionflow.api.serve import running_api
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef
from store import Store
from tests.sessionflow.api.conftest import Api, Message, Reader, ended, stored
from tests.workflows.harness import harness


@asynccontextmanager
async def stream(api: Api, sid: str, query: str = "", **headers: str) -> AsyncIterator[Reader]:
    async with api.http.stream("GET", f"/sessions/{sid}/events{query}", headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        yield Reader(r)


async def store_seqs(api: Api, sid: str) -> list[int]:
    return [event.seq for event in await api.h.events(sid)]


def seqs(messages: list[Message]) -> list[int]:
    return [event["seq"] for event in stored(messages)]


def synced(message: Message) -> bool:
    return message.event == "synced"


def terminal(message: Message) -> bool:
    return message.event == "message" and message.json()["type"].startswith("session.execution.")


def succeeded(message: Message) -> bool:
    return terminal(message) and message.json()["type"] == "session.execution.succeeded"


def delta(message: Message) -> bool:
    return message.event == "message" and message.json()["type"] == "session.text.delta"


async def prompt(api: Api, sid: str, text: str = "go") -> None:
    answer = await api.http.post(f"/sessions/{sid}/prompt", json={"text": text})
    assert answer.status_code == 200, answer.text


async def test_history_then_synced_then_live_events(api: Api) -> None:
    """Catalogue S5: the history-then-live handoff."""
    gate = api.h.gate_file("live")
    sid = await api.session(
        [
            {"text": "streamed before the gate", "chunks": 4, "delay_ms": 5},
            {"wait_for_file": gate},
            {"text": " and after it", "chunks": 3, "delay_ms": 5},
        ]
    )
    await prompt(api, sid)
    await api.h.until(lambda: _has_delta(api, sid))
    async with stream(api, sid) as reader:
        history = await reader.events(synced)
        assert history[-1].id is None  # the marker never moves a client's cursor
        assert history[-1].json()["seq"] == seqs(history)[-1]
        assert seqs(history) == list(range(len(history) - 1))
        api.h.open_gate("live")
        live = await reader.events(succeeded)
    everything = seqs(history) + seqs(live)
    assert everything == await store_seqs(api, sid)
    assert stored(live)[-1]["type"] == "session.execution.succeeded"
    assert [m.id for m in history + live if m.event == "message"] == [str(s) for s in everything]
    text = "".join(
        e["data"]["delta"] for e in stored(history + live) if e["type"].endswith("delta")
    )
    assert text == "streamed before the gate and after it"


async def _has_delta(api: Api, sid: str) -> bool:
    return any(e.type == "session.text.delta" for e in await api.h.events(sid))


async def test_a_reconnect_with_last_event_id_mid_turn_misses_and_repeats_nothing(api: Api) -> None:
    first, second = api.h.gate_file("first"), api.h.gate_file("second")
    sid = await api.session(
        [
            {"text": "one two three four", "chunks": 4, "delay_ms": 10},
            {"wait_for_file": first},
            {"text": " five six seven eight", "chunks": 8, "delay_ms": 10},
            {"wait_for_file": second},
            {"text": " nine ten", "chunks": 2},
        ]
    )
    await prompt(api, sid)
    await api.h.until(lambda: _busy(api, sid))
    async with stream(api, sid, "?until=idle") as reader:
        before = await reader.events(delta)
        api.h.open_gate("first")  # the turn streams on while this client is away
        before += await reader.events(delta)
    cursor = before[-1].id
    assert cursor is not None
    async with stream(api, sid, "?until=idle&after=0", **{"Last-Event-ID": cursor}) as reader:
        api.h.open_gate("second")
        after = await reader.rest()
    assert after[-1].event == "end"
    assert seqs(after)[0] == int(cursor) + 1  # Last-Event-ID wins over ?after=
    assert seqs(before) + seqs(after) == await store_seqs(api, sid)
    text = "".join(
        e["data"]["delta"] for e in stored(before + after) if e["type"].endswith("delta")
    )
    assert text == "one two three four five six seven eight nine ten"


async def test_many_subscribers_each_get_every_event(api: Api) -> None:
    async def subscriber(started: asyncio.Event, ready: list[int]) -> list[int]:
        async with stream(api, sid, "?until=idle") as reader:
            messages = await reader.events(synced)
            ready.append(1)
            if len(ready) == 20:
                started.set()
            messages += await reader.rest()
        assert messages[-1].event == "end"
        return seqs(messages)

    started, ready = asyncio.Event(), []
    # until=idle would end an idle session's stream at the marker: hold the session busy first.
    gate = api.h.gate_file("hold")
    sid = await api.session([{"wait_for_file": gate}, {"text": "to everyone", "chunks": 6}])
    await prompt(api, sid)
    await api.h.until(lambda: _busy(api, sid))
    tasks = [asyncio.create_task(subscriber(started, ready)) for _ in range(20)]
    await started.wait()
    api.h.open_gate("hold")
    results = await asyncio.gather(*tasks)
    expected = await store_seqs(api, sid)
    assert all(result == expected for result in results)


async def _busy(api: Api, sid: str) -> bool:
    return bool((await api.http.get(f"/sessions/{sid}/status")).json()["busy"])


async def test_a_slow_subscriber_holds_back_no_one_and_loses_nothing(api: Api) -> None:
    """Catalogue S8: a slow consumer."""
    big = "x" * 1_500_000  # megabytes of events: more than the sockets buffer for a non-reader
    gate = api.h.gate_file("slow")
    sid = await api.session([{"wait_for_file": gate}, {"text": big, "chunks": 30}])
    await prompt(api, sid)
    await api.h.until(lambda: _busy(api, sid))
    async with stream(api, sid, "?until=idle") as slow:
        history = await slow.events(synced)  # ...then reads nothing while the turn streams
        async with stream(api, sid, "?until=idle") as fast:
            api.h.open_gate("slow")
            quick = await fast.rest()
        assert quick[-1].event == "end"
        late = history + await slow.rest()
    expected = await store_seqs(api, sid)
    assert seqs(quick) == expected and seqs(late) == expected


STALL_EVENTS = 16_000  # four times the window: what it holds stays well under half the wire
STALL_BATCH = 1_000


async def _held(api: Api) -> int:
    return int((await api.http.get("/healthz")).json()["held_bytes"])


def _small_window_client(api: Api) -> httpx.AsyncClient:
    """A client whose socket takes 4 KiB at a time: what it does not read, the server holds
    (past the few MiB the server's socket buffers), so a stall is felt by the server."""
    options = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]
    transport = httpx.AsyncHTTPTransport(socket_options=options)
    return httpx.AsyncClient(base_url=api.url, timeout=30, transport=transport)


async def _read_through(reader: Reader, last: int) -> list[Message]:
    return await reader.events(lambda m: m.event == "message" and m.json()["seq"] >= last)


@pytest.mark.fault
async def test_a_stalled_subscriber_costs_a_bounded_window_and_resumes_in_order(
    api: Api,
) -> None:
    """Catalogue S8: a consumer that reads nothing while 16,000 small events are appended (in
    batches of 1,000, outside any busy period), while a second consumer reads along. The
    server's followers hold at most the window's frames, sampled after every batch, however far
    the stalled one falls behind (no per-subscriber queue: it holds a cursor); the reading
    consumer gets every event in order as it commits. The stalled one's socket takes 4 KiB, so
    the server cannot hand the 5.5 MB of frames to the sockets: its sends to that client wait.
    Then the stalled consumer drops its connection and comes back with its ``Last-Event-ID``: it
    gets every event from history, in order, and the server closes every stream it held."""
    sid = await api.session([{"text": "unused"}])
    model = ModelRef.parse("scripted/" + str(api.h.workspace / "none.json"))
    slow = Api(api.h, api.url, _small_window_client(api))
    async with slow.http, stream(slow, sid) as stalled, stream(api, sid) as reading:
        history = await stalled.events(synced)
        await reading.events(synced)
        last = (await store_seqs(api, sid))[-1] + STALL_EVENTS
        follower = asyncio.create_task(_read_through(reading, last))
        held: list[int] = []
        for _ in range(STALL_EVENTS // STALL_BATCH):
            batch = [ev.ModelSelected(session_id=sid, model=model) for _ in range(STALL_BATCH)]
            await api.h.store.events.publish_many(batch)
            held.append(await _held(api))
        live = await follower
        wire = sum(len(m.data) for m in live)
    # The stalled consumer gives up on its connection and comes back with its cursor.
    cursor = str(seqs(history)[-1])
    async with stream(api, sid, **{"Last-Event-ID": cursor}) as resumed:
        late = history + await _read_through(resumed, last)
    await api.h.until(lambda: _streams(api, 0))
    expected = await store_seqs(api, sid)
    assert len(expected) > STALL_EVENTS and expected[-1] == last
    assert seqs(history + live[:-1] + live[-1:]) == expected
    assert seqs(late) == expected
    # Bounded by the window, never by how far behind the stalled one is.
    assert max(held) <= WINDOW_BYTES + KEPT_PAGE_BYTES
    assert max(held) < wire / 2, (max(held), wire)
    assert len(live) > WINDOW_FRAMES


async def test_clients_that_leave_end_their_streams(api: Api) -> None:
    sid = await api.session([{"text": "hi"}])
    readers = [stream(api, sid) for _ in range(5)]
    opened = [await r.__aenter__() for r in readers]
    for reader in opened:
        await reader.events(synced)
    await opened[0].keepalive()  # an idle stream sends keep-alive comments
    assert (await api.http.get("/healthz")).json()["streams"] == 5
    for r in readers:
        await r.__aexit__(None, None, None)
    await api.h.until(lambda: _streams(api, 0))


async def _streams(api: Api, count: int) -> bool:
    return bool((await api.http.get("/healthz")).json()["streams"] == count)


async def test_until_idle_ends_an_idle_sessions_stream_after_its_history(api: Api) -> None:
    sid = await api.session([{"text": "done"}])
    async with stream(api, sid, "?until=idle") as reader:
        messages = await reader.rest()
    assert [m.event for m in messages] == ["message", "synced", "end"]  # session.created
    async with stream(api, sid, "?after=0&until=idle") as reader:
        assert [m.event for m in await reader.rest()] == ["synced", "end"]


async def test_until_idle_waits_for_work_that_waits_for_a_worker(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    """``until=idle`` ends when the SDK says idle: a prompt with no worker polling is not idle
    (``SessionStatus.idle``), so the stream stays open until a worker has run it."""
    async with (
        harness(temporal_env.client, store, tmp_path, start_worker=False) as h,
        running_api(h.client, ApiSettings(port=0)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        api = Api(h, url, http)
        sid = await api.session([{"text": "at last"}])
        await h.client.prompt(sid, "anyone there?")
        async with stream(api, sid, "?until=idle") as reader:
            await reader.events(synced)
            # The stream asked for the status as it sent the marker; asked after it, the same
            # question has had the same answer by now: an idle stream would be ending.
            assert (await h.client.status(sid)).waiting_for_worker
            async with h.worker():
                messages = await reader.events(ended)
                assert await reader.rest() == []
        types = [m.json()["type"] for m in messages if m.event == "message"]
        # The whole busy period the worker ran, not an ``end`` at the marker.
        assert types[:1] == ["session.execution.started"], types
        assert types[-1:] == ["session.execution.succeeded"], types
        assert seqs(messages)[-1] == (await store_seqs(api, sid))[-1]


async def test_bad_cursors_are_refused(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    for headers, query, field in (
        ({"Last-Event-ID": "abc"}, "", "Last-Event-ID"),
        ({}, "?after=-2", "after"),
        ({}, "?until=x", "until"),
    ):
        answer = await api.http.get(f"/sessions/{sid}/events{query}", headers=headers)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["type"] == "InvalidInputError"
        assert answer.json()["error"]["field"] == field
    missing = await api.http.get("/sessions/ses_missing/events")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "SessionNotFoundError"


async def test_a_stream_over_the_sdk_client_cursor_matches(api: Api) -> None:
    """``after=`` alone resumes too (a client that keeps its own cursor)."""
    sid = await api.session([{"text": "a b c", "chunks": 3}])
    await prompt(api, sid)
    await api.h.client.wait_idle(sid)
    await api.h.until(lambda: _settled(api, sid))
    async with stream(api, sid, "?after=3&until=idle") as reader:
        tail = seqs(await reader.rest())
    assert tail == (await store_seqs(api, sid))[4:]


async def _settled(api: Api, sid: str) -> bool:
    return (await api.h.types(sid))[-1] == "session.execution.succeeded"
