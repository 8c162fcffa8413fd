"""``GET /sessions/{id}/events``: the session's log as Server-Sent Events."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Request

from sessionflow.api.deps import Client, SessionId, Settings
from sessionflow.api.sse import EventStream
from sessionflow.api.stream import session_stream
from sessionflow.errors import InvalidInputError

router = APIRouter(prefix="/sessions/{session_id}", tags=["events"])

# A client that stops reading for this long is dropped; it resumes from its Last-Event-ID.
SEND_TIMEOUT_S = 60.0


@router.get(
    "/events",
    response_class=EventStream,
    responses={200: {"content": {"text/event-stream": {}}, "description": "the event stream"}},
)
async def events(
    session_id: SessionId,
    request: Request,
    client: Client,
    settings: Settings,
    after: Annotated[int, Query(ge=-1, description="send events with a larger seq")] = -1,
    until: Annotated[Literal["idle"] | None, Query(description="end when idle")] = None,
    last_event_id: Annotated[str | None, Header(description="overrides ?after=")] = None,
) -> EventStream:
    """History after the cursor, a ``synced`` event, then live events; each event's ``id`` is
    its seq, so a reconnect with ``Last-Event-ID`` neither misses nor repeats one. Keep-alive
    comments every ``SESSIONFLOW_API_KEEPALIVE_S``."""
    cursor = _cursor(last_event_id) if last_event_id else after
    await client.session(session_id)  # 404 before the stream starts, not inside it
    streams = request.app.state.streams
    stream = session_stream(
        streams.feeds, session_id, after=cursor, until_idle=until == "idle", status=streams.status
    )
    return EventStream(
        streams.track(stream),
        ping=settings.keepalive_s,
        send_timeout=SEND_TIMEOUT_S,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _cursor(value: str) -> int:
    if not value.lstrip("-").isdigit() or int(value) < -1:
        raise InvalidInputError(
            f"Last-Event-ID must be an event seq (an integer >= -1), got {value[:40]!r}",
            field="Last-Event-ID",
        )
    return int(value)
