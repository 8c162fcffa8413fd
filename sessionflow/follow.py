"""``sessionflow watch``: render a session's log, and know when the session is idle now.

``--until-idle`` replays the whole history first (every busy period, not just the first), then
asks the session itself whether it is idle, at the handoff to live events, after each terminal
event and whenever the log has been quiet for a second; so it also ends on a session that was
idle before it started, and never on a terminal event that a successor busy period follows.
Idle with prompts pending (an interrupt claimed their wakes, or they were admitted without
one), it ends too, and says how many prompts no busy period will run.

A store outage past the history is ridden out, said once ("store unavailable, retrying"),
never as log lines in the middle of the streamed text.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rich.console import Console

from sessionflow.client import ClientEvent, SessionClient, SessionStatus
from sessionflow.errors import StoreUnavailableError
from sessionflow.models.permissions import PermissionRequest
from sessionflow.watch import TERMINALS, Renderer
from store.events import StoredEvent, Synced

QUIET_S = 1.0  # with no event for this long, ask again whether the session is idle
OUTAGE_NOTE = "store unavailable, retrying"


@dataclass(frozen=True)
class Followed:
    """How a follow ended: the type of the last terminal event seen, and (``--until-idle``)
    how many prompts are pending that no busy period will run."""

    last: str | None
    unrun: int = 0


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
    on_ask: Callable[[PermissionRequest], Awaitable[None]] | None = None,
) -> Followed:
    """Render events after ``after``; return how the follow ended (``Followed``).

    With ``on_ask`` (a person at a terminal), each request the session waits on is offered to
    it, once: those already waiting when the history has been replayed, then each new one."""
    renderer = Renderer(console, as_json=as_json, full=full)
    items: asyncio.Queue[StoredEvent | Synced] = asyncio.Queue()
    asks: asyncio.Queue[PermissionRequest] = asyncio.Queue()
    unanswered: dict[str, PermissionRequest] = {}  # asked and not yet replied, from the log

    async def answer() -> None:
        assert on_ask is not None
        while True:
            request = await asks.get()
            if request.request_id in unanswered:
                renderer.close()  # the live table would redraw over the question
                await on_ask(request)

    def note_request(event: ClientEvent, live: bool) -> None:
        if event.type == "session.permission.asked":
            request = PermissionRequest.model_validate(event.data["request"])
            unanswered[request.request_id] = request
            if live:
                asks.put_nowait(request)
        elif event.type == "session.permission.replied":
            unanswered.pop(str(event.data.get("request_id")), None)

    outage = _Outage(on_waiting)

    async def pump() -> None:
        log = client.store.events.log(session_id, after=after, follow=True, on_outage=outage)
        async for item in log:
            outage.over()
            await items.put(item)

    answering = asyncio.create_task(answer()) if on_ask is not None else None
    reader = asyncio.create_task(pump())
    synced, last, warned = False, None, False
    try:
        while True:
            item = await _next(items, reader, QUIET_S if synced else None)
            if isinstance(item, Synced):
                if not synced:  # what waited before the watch began, in the order asked
                    for request in unanswered.values():
                        asks.put_nowait(request)
                synced = True
            elif isinstance(item, StoredEvent):
                event = ClientEvent.of(item)
                renderer.render(event)
                note_request(event, live=synced)
                if event.type not in TERMINALS:
                    continue
                last = event.type
                if not synced:
                    continue
            if not until_idle:
                continue
            status = await _status(client, session_id, outage)
            if status is None:
                continue  # the store is away: asked again once the log is quiet
            if status.idle:
                last = last or await last_terminal(client, session_id)
                return Followed(last, status.pending_inputs)
            if status.waiting_for_worker and not warned and on_waiting is not None:
                on_waiting(f"{status.waiting_for_worker} Waiting.")
                warned = True
    finally:
        for task in (reader, answering):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        renderer.close()


class _Outage:
    """Says once per outage that the store is away; a read that succeeds ends the outage."""

    def __init__(self, note: Callable[[str], None] | None) -> None:
        self.note = note
        self.away = False

    def __call__(self, _reason: str) -> None:
        if not self.away and self.note is not None:
            self.note(OUTAGE_NOTE)
        self.away = True

    def over(self) -> None:
        self.away = False


async def _status(client: SessionClient, session_id: str, outage: _Outage) -> SessionStatus | None:
    """The session's status, or None while the store cannot be read."""
    try:
        status = await client.status(session_id)
    except StoreUnavailableError as error:
        outage(error.reason)
        return None
    outage.over()
    return status


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
