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
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict

from sse_starlette import ServerSentEvent

from sessionflow.client import ClientEvent, SessionClient, SessionStatus
from sessionflow.watch import TERMINALS
from store.events import StoredEvent

# A terminal is committed a moment before its busy period stops being busy in the status query:
# ask again, backing off, for about half a minute at most.
_SETTLE_DELAYS_S = (0.05, 0.1, 0.2, 0.4, *([1.0] * 30))
StatusOf = Callable[[str], Awaitable[SessionStatus]]


def event_message(event: ClientEvent) -> ServerSentEvent:
    # ASCII JSON: a lone surrogate the store kept is spelled \udxxx, never an unencodable byte.
    return ServerSentEvent(data=json.dumps(asdict(event)), id=str(event.seq))


async def session_stream(
    client: SessionClient, session_id: str, *, after: int, until_idle: bool, status: StatusOf
) -> AsyncIterator[ServerSentEvent]:
    async for item in client.store.events.log(session_id, after=after, follow=True):
        if not isinstance(item, StoredEvent):
            yield ServerSentEvent(data=json.dumps({"seq": item.seq}), event="synced")
            if until_idle and _idle(await status(session_id)):
                yield _end()
                return
            continue
        event = ClientEvent.of(item)
        yield event_message(event)
        if until_idle and event.type in TERMINALS and await _settled(status, session_id, event):
            yield _end()
            return


class Streams:
    """The app's streams: how many are open (``/healthz``; each ends when its client leaves),
    and one status query per session at a time, shared by all of them: queries run on the
    worker, and two hundred streams asking at once would slow the very drain they wait for."""

    def __init__(self, client: SessionClient) -> None:
        self.client = client
        self.open = 0
        self._asking: dict[str, asyncio.Task[SessionStatus]] = {}

    async def status(self, session_id: str) -> SessionStatus:
        task = self._asking.get(session_id)
        if task is None:
            task = asyncio.create_task(self.client.status(session_id))
            self._asking[session_id] = task
            task.add_done_callback(lambda done: self._forget(session_id, done))
        return await asyncio.shield(task)

    def _forget(self, session_id: str, done: asyncio.Task[SessionStatus]) -> None:
        if self._asking.get(session_id) is done:
            del self._asking[session_id]

    async def track(self, stream: AsyncIterator[ServerSentEvent]) -> AsyncIterator[ServerSentEvent]:
        self.open += 1
        try:
            async for message in stream:
                yield message
        finally:
            self.open -= 1


def _end() -> ServerSentEvent:
    return ServerSentEvent(data=json.dumps({"reason": "idle"}), event="end")


def _idle(status: SessionStatus) -> bool:
    return not status.busy and not (status.drain and status.drain.pending_wake)


async def _settled(status_of: StatusOf, session_id: str, terminal: ClientEvent) -> bool:
    """True if no busy period follows ``terminal``'s; False if a successor runs (keep going)."""
    for delay in _SETTLE_DELAYS_S:
        status = await status_of(session_id)
        if _idle(status):
            return True
        if status.drain is None or status.drain.execution_id != terminal.data.get("execution_id"):
            return False  # a successor busy period: its own terminal will come
        await asyncio.sleep(delay)  # this period is still settling after its terminal
    return False
