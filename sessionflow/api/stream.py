"""A session's SSE stream: the store's log, with the seq as each event's id.

History after the cursor, a ``synced`` marker (no id, so it never moves the client's cursor),
then live events as they commit. The cursor is the client's: ``Last-Event-ID`` (an
``EventSource`` sends it on every reconnect) or ``?after=``. Live events come from the session's
shared ``Feed`` (one store follower for all its subscribers); what the feed's window lacks is
read from the table, so a slow client holds a cursor, not a queue, and lags without loss or
harm to others.

``until=idle`` ends the stream with an ``end`` event once the session is idle as the SDK means
it (``SessionStatus.idle``: no busy period runs and none is about to, so work waiting for a
worker keeps the stream open): at the marker if the session is idle then, else after the
terminal event of the last busy period; either way after every event committed by then.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from sse_starlette import ServerSentEvent

from sessionflow.api.errors import unavailable_response
from sessionflow.api.feed import Feed, Feeds, Frame, writes
from sessionflow.client import SessionClient, SessionStatus
from sessionflow.errors import StoreUnavailableError
from sessionflow.watch import TERMINALS

log = logging.getLogger(__name__)
# A terminal is committed a moment before its busy period stops being busy in the status query:
# ask again, backing off, for about half a minute at most.
_SETTLE_DELAYS_S = (0.05, 0.1, 0.2, 0.4, *([1.0] * 30))
StatusOf = Callable[[str], Awaitable[SessionStatus]]
Chunk = bytes | ServerSentEvent


async def session_stream(
    feeds: Feeds, session_id: str, *, after: int, until_idle: bool, status: StatusOf
) -> AsyncIterator[Chunk]:
    """The stream; if the store fails under it, it ends (the client resumes by its cursor)."""
    try:
        async for chunk in _stream(
            feeds, session_id, after=after, until_idle=until_idle, status=status
        ):
            yield chunk
    except Exception as error:
        if unavailable_response(error) is None and not isinstance(error, StoreUnavailableError):
            raise
        log.warning("The stream of session %s ended: %s", session_id, error)


async def _stream(
    feeds: Feeds, session_id: str, *, after: int, until_idle: bool, status: StatusOf
) -> AsyncIterator[Chunk]:
    target = await feeds.events.latest_sequence(session_id)
    async with feeds.joined(session_id, target) as feed:
        async for chunk in _sent(feed.frames(after, through=target)):
            yield chunk
        cursor = max(after, target)
        yield _synced(target)
        if until_idle and (await status(session_id)).idle:
            async for chunk in _finish(feed, cursor):
                yield chunk
            return
        async for batch in feed.frames(cursor):
            for frame in writes(batch):
                yield frame
            cursor = batch[-1].seq
            terminals = [frame for frame in batch if frame.type in TERMINALS]
            if until_idle and terminals and await _settled(status, session_id, terminals[-1]):
                async for chunk in _finish(feed, cursor):
                    yield chunk
                return


async def _sent(batches: AsyncIterator[list[Frame]]) -> AsyncIterator[Chunk]:
    async for batch in batches:
        for frame in writes(batch):
            yield frame


async def _finish(feed: Feed, cursor: int) -> AsyncIterator[Chunk]:
    """Idle: what committed up to now (nothing more is coming), then ``end``."""
    latest = await feed.events.latest_sequence(feed.session_id)
    async for chunk in _sent(feed.frames(cursor, through=latest)):
        yield chunk
    yield ServerSentEvent(data=json.dumps({"reason": "idle"}), event="end")


def _synced(target: int) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps({"seq": target if target >= 0 else None}), event="synced"
    )


class Streams:
    """The app's streams: how many are open (``/healthz``; each ends when its client leaves),
    and one status query per session at a time, shared by all of them: queries run on the
    worker, and two hundred streams asking at once would slow the very drain they wait for."""

    def __init__(self, client: SessionClient) -> None:
        self.client = client
        self.open = 0
        self.feeds = Feeds(client.store.events)
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

    async def track(self, stream: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
        self.open += 1
        try:
            async for message in stream:
                yield message
        finally:
            self.open -= 1


async def _settled(status_of: StatusOf, session_id: str, terminal: Frame) -> bool:
    """True if no busy period follows ``terminal``'s; False if a successor runs (keep going)."""
    for delay in _SETTLE_DELAYS_S:
        status = await status_of(session_id)
        if status.idle:
            return True
        if status.drain is not None and status.drain.execution_id != terminal.execution_id:
            return False  # a successor busy period: its own terminal will come
        # This period still settling after its terminal, or its successor not yet answering
        # (waiting for a worker): ask again.
        await asyncio.sleep(delay)
    return False
