"""The SSE response: a send deadline that costs a timer per send, not an anyio cancel scope,
and still drops a client that stops taking bytes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from sse_starlette.sse import SendTimeoutError

from sessionflow.api.sse import EventStream
from tests.sessionflow.api.conftest import Api
from tests.sessionflow.api.test_feed import contexts, raw_stream

SCOPE = {"type": "http", "method": "GET", "headers": []}


def counted_scopes(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Every anyio ``move_on_after`` opened from now on (sse-starlette's per-send scope)."""
    opened: list[float | None] = []
    original = anyio.move_on_after

    def counting(delay: float | None, shield: bool = False) -> Any:
        opened.append(delay)
        return original(delay, shield=shield)

    monkeypatch.setattr(anyio, "move_on_after", counting)
    return opened


async def test_a_streams_sends_open_no_cancel_scope(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await api.session([{"text": "x"}])
    opened = counted_scopes(monkeypatch)
    async with raw_stream(api, sid) as raw:
        await raw.until(b"event: synced")
        for batch in range(5):
            await contexts(api, sid, 3, f"b{batch}-")
            await raw.until(f'"key": "b{batch}-2"'.encode())
    assert len(raw.bodies) >= 7  # history, marker, five live batches
    assert opened == []


async def chunks(count: int) -> AsyncIterator[bytes]:
    for i in range(count):
        yield f"data: {i}\r\n\r\n".encode()


async def test_a_client_that_stops_taking_bytes_is_dropped() -> None:
    sent: list[dict[str, Any]] = []
    stuck = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) == 3:  # the start, one chunk, then the client's window is full
            await stuck.wait()

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # never disconnects
        return {}

    response = EventStream(chunks(10), send_timeout=0.05, ping=0)
    with pytest.raises(SendTimeoutError):
        await response(SCOPE, receive, send)
    assert len(sent) == 3


async def test_a_disconnect_during_a_send_is_not_a_timeout() -> None:
    sent: list[dict[str, Any]] = []
    waiting, left = asyncio.Event(), asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) == 2:
            waiting.set()
            await asyncio.Event().wait()  # cancelled when the client leaves

    async def receive() -> dict[str, Any]:
        await waiting.wait()
        left.set()
        return {"type": "http.disconnect"}

    response = EventStream(chunks(10), send_timeout=60, ping=0)
    await response(SCOPE, receive, send)  # ends quietly
    assert left.is_set() and len(sent) == 2
