"""One follower per session, shared by every SSE subscriber of that session.

Two hundred browsers watching one agent must not become two hundred store followers, each
re-reading the table on every doorbell. A ``Feed`` follows the store's log once, encodes each
event once, and keeps a bounded window of the newest frames; a subscriber reads the window from
its own cursor. The window is a cache, not a buffer: whatever it lacks (history from before the
feed started, or frames a slow subscriber fell behind) the subscriber reads from the table
itself, so a restart or an eviction can delay an event but never lose or repeat one.

Frames that are ready together leave in one write: a subscriber takes everything past its
cursor at once, so a burst of token deltas costs one send, not one per delta.

History is shared too: subscribers that need the same page of the table (two hundred browsers
opening one long session) share one read and one encoding of it, and the last few pages read
stay for whoever asks next. A page below the window's head never changes, so keeping it is safe.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import asdict, dataclass

from sse_starlette import ServerSentEvent

from sessionflow.client import ClientEvent
from store.events import EventStore, StoredEvent

# The window's bounds: room for a long turn's deltas, never more than a few MiB per session.
WINDOW_FRAMES = 4096
WINDOW_BYTES = 8 * 1024 * 1024
# One write carries at most about this much, so a far-behind subscriber's catch-up goes out in
# pieces the transport can pace (each write waits for the client to take the previous ones).
WRITE_BYTES = 256 * 1024
# Table pages kept after they were read, for subscribers that start a moment later.
KEPT_PAGES = 8
KEPT_PAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Frame:
    """One event as it goes on the wire, and what ``until=idle`` needs to know of it."""

    seq: int
    type: str
    execution_id: str | None
    wire: bytes

    @classmethod
    def of(cls, stored: StoredEvent) -> Frame:
        event = ClientEvent.of(stored)
        # ASCII JSON: a lone surrogate the store kept is spelled \udxxx, never an unencodable byte.
        message = ServerSentEvent(data=json.dumps(asdict(event)), id=str(event.seq))
        return cls(event.seq, event.type, event.data.get("execution_id"), message.encode())


class Feed:
    """A session's shared follower. All known events with ``floor < seq <= head`` are in the
    window; ``frames`` serves any cursor, from the window when it can, else from the table."""

    def __init__(
        self,
        events: EventStore,
        session_id: str,
        start: int,
        *,
        max_frames: int = WINDOW_FRAMES,
        max_bytes: int = WINDOW_BYTES,
    ) -> None:
        self.events, self.session_id = events, session_id
        self.floor = self.head = start
        self.max_frames, self.max_bytes = max_frames, max_bytes
        self.subscribers = 0
        self.error: BaseException | None = None
        self._frames: list[Frame] = []
        self._first = 0  # frames before this index were evicted
        self._bytes = 0
        self._changed = asyncio.Event()
        self._reading: dict[tuple[int, int], asyncio.Task[TablePage]] = {}
        self._pages: OrderedDict[tuple[int, int], TablePage] = OrderedDict()
        self._page_bytes = 0
        self._task = asyncio.create_task(self._follow(start), name=f"feed-{session_id}")

    @property
    def failed(self) -> bool:
        return self._task.done()

    @property
    def held_bytes(self) -> int:
        """What this feed holds for its subscribers: the window and the kept table pages."""
        return self._bytes + self._page_bytes

    async def close(self) -> None:
        for task in (self._task, *self._reading.values()):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _follow(self, start: int) -> None:
        try:
            # A store that fails ends the feed and its streams (``ride_out=False``): their
            # clients reconnect from their last id, and the API answers 503 meanwhile.
            following = self.events.log(self.session_id, after=start, follow=True, ride_out=False)
            async for item in following:
                if isinstance(item, StoredEvent):
                    self._add(Frame.of(item))
                elif item.seq is not None and item.seq > self.head:
                    self.head = item.seq  # events of types this process does not know
                self._notify()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self.error = error  # its subscribers end; the next one starts a new feed
            self._notify()

    def _add(self, frame: Frame) -> None:
        self._frames.append(frame)
        self._bytes += len(frame.wire)
        self.head = frame.seq
        while len(self._frames) - self._first > self.max_frames or self._bytes > self.max_bytes:
            evicted = self._frames[self._first]
            self._first += 1
            self._bytes -= len(evicted.wire)
            self.floor = evicted.seq
        if self._first > len(self._frames) // 2:  # compact now and then, not on every frame
            del self._frames[: self._first]
            self._first = 0

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _window(self, cursor: int, through: int | None) -> list[Frame]:
        start = bisect.bisect_right(self._frames, cursor, lo=self._first, key=lambda f: f.seq)
        frames = self._frames[start:]
        if through is not None and frames and frames[-1].seq > through:
            frames = frames[: bisect.bisect_right(frames, through, key=lambda f: f.seq)]
        return frames

    async def frames(self, after: int, through: int | None = None) -> AsyncIterator[list[Frame]]:
        """Every event with ``after < seq`` (``<= through`` if given, then it ends) in seq
        order, in batches: each batch is what was ready at once. Raises what stopped the feed."""
        cursor = after
        while through is None or cursor < through:
            if self.error is not None:
                raise self.error
            changed = self._changed
            if self.floor <= cursor < self.head:
                batch = self._window(cursor, through)
                cursor = self.head if through is None else min(self.head, through)
            elif cursor < self.floor or through is not None:
                # Older than the window, or history the feed has not reached yet: the table.
                limit = self.floor if cursor < self.floor else through
                assert limit is not None
                limit = limit if through is None else min(limit, through)
                batch, read_to = await self._page(cursor, limit)
                cursor = read_to if read_to > cursor else limit
            else:
                await changed.wait()
                continue
            if batch:
                yield batch

    async def _page(self, cursor: int, limit: int) -> TablePage:
        """The table's next page after ``cursor`` (``seq <= limit``) as frames and the seq it
        read to: one read and one encoding for every subscriber that asks for it."""
        key = (cursor, limit)
        if (kept := self._pages.get(key)) is not None:
            self._pages.move_to_end(key)
            return kept
        task = self._reading.get(key)
        if task is None:
            task = self._reading[key] = asyncio.create_task(self._read(key))
            task.add_done_callback(lambda done: self._read_done(key, done))
        # Shielded: a subscriber that leaves does not cancel the read of those that stay.
        return await asyncio.shield(task)

    async def _read(self, key: tuple[int, int]) -> TablePage:
        page = await self.events.read_after(self.session_id, key[0], through=key[1])
        return [Frame.of(event) for event in page.events], page.cursor

    def _read_done(self, key: tuple[int, int], done: asyncio.Task[TablePage]) -> None:
        if self._reading.get(key) is done:
            del self._reading[key]
        if done.cancelled() or done.exception() is not None:
            return
        page = self._pages[key] = done.result()
        self._page_bytes += sum(len(frame.wire) for frame in page[0])
        while len(self._pages) > KEPT_PAGES or self._page_bytes > KEPT_PAGE_BYTES:
            _, (frames, _) = self._pages.popitem(last=False)
            self._page_bytes -= sum(len(frame.wire) for frame in frames)


TablePage = tuple[list[Frame], int]  # frames of one table page, and the seq it read to


def writes(batch: list[Frame]) -> Iterator[bytes]:
    """A batch as few writes as ``WRITE_BYTES`` allows (at least one frame each)."""
    chunk: list[bytes] = []
    size = 0
    for frame in batch:
        if chunk and size + len(frame.wire) > WRITE_BYTES:
            yield b"".join(chunk)
            chunk, size = [], 0
        chunk.append(frame.wire)
        size += len(frame.wire)
    if chunk:
        yield b"".join(chunk)


class Feeds:
    """The app's feeds, one per session with subscribers; a feed stops with its last one."""

    def __init__(self, events: EventStore) -> None:
        self.events = events
        self._feeds: dict[str, Feed] = {}

    def __len__(self) -> int:
        return len(self._feeds)

    @property
    def held_bytes(self) -> int:
        """Frames held for every stream, together: bounded per session, never per subscriber."""
        return sum(feed.held_bytes for feed in self._feeds.values())

    @contextlib.asynccontextmanager
    async def joined(self, session_id: str, start: int) -> AsyncIterator[Feed]:
        """The session's feed (started from ``start`` if none runs, or a failed one ran)."""
        feed = self._feeds.get(session_id)
        if feed is None or feed.failed:
            feed = self._feeds[session_id] = Feed(self.events, session_id, start)
        feed.subscribers += 1
        try:
            yield feed
        finally:
            feed.subscribers -= 1
            if feed.subscribers == 0:
                if self._feeds.get(session_id) is feed:
                    del self._feeds[session_id]
                await feed.close()
