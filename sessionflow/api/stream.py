"""A session's SSE stream: the store's log, with the seq as each event's id.

History after the cursor, a ``synced`` marker (no id, so it never moves the client's cursor),
then live events as they commit. The cursor is the client's: ``Last-Event-ID`` (an
``EventSource`` sends it on every reconnect) or ``?after=``. Nothing is buffered here: a slow
client holds a cursor into the table, not a queue, so it can lag without loss or harm to others.

``until=idle`` ends the stream with an ``end`` event once no busy period runs: at the marker if
the session is idle then, else after the terminal event of the last busy period.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict

from sse_starlette import ServerSentEvent

from sessionflow.client import ClientEvent, SessionClient
from sessionflow.watch import TERMINALS
from store.events import StoredEvent

# How long a terminal may stay "busy" in the status query while its busy period finishes.
_SETTLE_POLLS, _SETTLE_POLL_S = 200, 0.05


def event_message(event: ClientEvent) -> ServerSentEvent:
    # ASCII JSON: a lone surrogate the store kept is spelled \udxxx, never an unencodable byte.
    return ServerSentEvent(data=json.dumps(asdict(event)), id=str(event.seq))


async def session_stream(
    client: SessionClient, session_id: str, *, after: int, until_idle: bool
) -> AsyncIterator[ServerSentEvent]:
    async for item in client.store.events.log(session_id, after=after, follow=True):
        if not isinstance(item, StoredEvent):
            yield ServerSentEvent(data=json.dumps({"seq": item.seq}), event="synced")
            if until_idle and await _idle(client, session_id):
                yield _end()
                return
            continue
        event = ClientEvent.of(item)
        yield event_message(event)
        if until_idle and event.type in TERMINALS and await _settled(client, session_id, event):
            yield _end()
            return


class Streams:
    """How many streams this app is serving (``/healthz``): each ends when its client leaves."""

    def __init__(self) -> None:
        self.open = 0

    async def track(self, stream: AsyncIterator[ServerSentEvent]) -> AsyncIterator[ServerSentEvent]:
        self.open += 1
        try:
            async for message in stream:
                yield message
        finally:
            self.open -= 1


def _end() -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"reason": "idle"}), event="end")


async def _idle(client: SessionClient, session_id: str) -> bool:
    status = await client.status(session_id)
    return not status.busy and not (status.drain and status.drain.pending_wake)


async def _settled(client: SessionClient, session_id: str, terminal: ClientEvent) -> bool:
    """True if no busy period follows ``terminal``'s; False if a successor runs (keep going)."""
    for _ in range(_SETTLE_POLLS):
        status = await client.status(session_id)
        drain = status.drain
        if not status.busy and not (drain and drain.pending_wake):
            return True
        if drain is None or drain.execution_id != terminal.data.get("execution_id"):
            return False  # a successor busy period: its own terminal will come
        await asyncio.sleep(_SETTLE_POLL_S)  # this period is still settling after its terminal
    return False
