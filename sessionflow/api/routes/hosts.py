"""``GET /hosts``: the hosts whose workers run tools, each worker's lease and its state."""

from __future__ import annotations

from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from sessionflow.api.deps import Client

router = APIRouter(tags=["hosts"])


class HostLease(BaseModel):
    host: str
    worker: str
    task_queue: str = Field(description="the queue its tools run on: <task queue>@<host>")
    version: str
    tools: list[str] = Field(description="the tools it offers")
    started_at: int = Field(description="epoch ms")
    last_seen: int = Field(description="epoch ms, by the database clock")
    seen_ms_ago: int
    status: Literal["live", "late", "gone"] = Field(
        description="live; late: missed two renewals (restarting?); gone: its lease ran out"
    )


@router.get("/hosts", response_model=list[HostLease])
async def hosts(client: Client) -> list[HostLease]:
    """Every host's worker leases, most recently seen first."""
    return [HostLease.model_validate(asdict(w)) for w in await client.hosts()]
