"""``sessionflow watch``: render a session's log, and know when the session is idle now.

``--until-idle`` replays the whole history first (every busy period, not just the first), then
asks the session itself whether it is idle, at the handoff to live events, after each terminal
event and whenever the log has been quiet for a second; so it also ends on a session that was
idle before it started, and never on a terminal event that a successor busy period follows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from rich.console import Console

from sessionflow.client import ClientEvent, SessionClient
from sessionflow.watch import TERMINALS, Renderer
from store.events import StoredEvent, Synced

QUIET_S = 1.0  # with no event for this long, ask again whether the session is idle


async def follow(
    client: SessionClient,
    session_id: str,
    console: Console,
    *,
    after: int,
    as_json: bool,
    until_idle: bool,
    full: bool = False,
    on_waiting: Callable[[str], None] | None = None,
) -> str | None:
    """Render events after ``after``; return the type of the last terminal event seen."""
    renderer = Renderer(console, as_json=as_json, full=full)
    items: asyncio.Queue[StoredEvent | Synced] = asyncio.Queue()

    async def pump() -> None:
        async for item in client.store.events.log(session_id, after=after, follow=True):
            await items.put(item)

    reader = asyncio.create_task(pump())
    synced, last, warned = False, None, False
    try:
        while True:
            item = await _next(items, reader, QUIET_S if synced else None)
            if isinstance(item, Synced):
                synced = True
            elif isinstance(item, StoredEvent):
                event = ClientEvent.of(item)
                renderer.render(event)
                if event.type not in TERMINALS:
                    continue
                last = event.type
                if not synced:
                    continue
            if not until_idle:
                continue
            status = await client.status(session_id)
            if status.idle:
                return last or await last_terminal(client, session_id)
            if status.waiting_for_worker and not warned and on_waiting is not None:
                on_waiting(f"{status.waiting_for_worker} Waiting.")
                warned = True
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        renderer.close()


async def last_terminal(client: SessionClient, session_id: str) -> str | None:
    """How the session's last busy period ended, when the watched events did not say
    (``--after`` past it)."""
    last = None
    async for event in client.events(session_id):
        if event.type in TERMINALS:
            last = event.type
    return last


async def _next(
    items: asyncio.Queue[StoredEvent | Synced], reader: asyncio.Task[None], quiet: float | None
) -> StoredEvent | Synced | None:
    """The next item, or None after ``quiet`` seconds of quiet; the reader's error if it died."""
    getter = asyncio.ensure_future(items.get())
    done, _ = await asyncio.wait({getter, reader}, timeout=quiet, return_when="FIRST_COMPLETED")
    if getter in done:
        return getter.result()
    getter.cancel()
    if reader in done:
        reader.result()  # raises what ended the log
        raise RuntimeError("the event log ended")
    return None
