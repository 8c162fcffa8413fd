"""``GET /healthz``: can this server reach the store and Temporal; how many streams it serves."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from sessionflow.api.deps import Client

router = APIRouter(tags=["health"])


class Health(BaseModel):
    store: bool
    temporal: bool
    streams: int
    followers: int = Field(description="store followers: one per session with streams")
    held_bytes: int = Field(
        default=0,
        description="event frames the followers hold for their streams (bounded per session)",
    )


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def health(request: Request, client: Client, response: Response) -> Health:
    store = temporal = True
    try:
        await client.store.events.latest_sequence("healthz")
    except Exception:
        store = False
    try:
        temporal = await client.temporal.service_client.check_health()
    except Exception:
        temporal = False
    if not (store and temporal):
        response.status_code = 503
    streams = request.app.state.streams
    return Health(
        store=store,
        temporal=temporal,
        streams=streams.open,
        followers=len(streams.feeds),
        held_bytes=streams.feeds.held_bytes,
    )
