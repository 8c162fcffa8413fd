"""A session harness for drain tests: a store, a worker on a fresh task queue, a client, scripts."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from sessionflow.client import ClientEvent, SessionClient
from store import Store
from worker import build_worker


class Harness:
    def __init__(self, client: SessionClient, store: Store, root: Path) -> None:
        self.client = client
        self.store = store
        self.root = root
        self.workspace = root / "workspace"
        self.workspace.mkdir(exist_ok=True)

    def script(self, *turns: list[dict[str, Any]], name: str = "model.json") -> str:
        path = self.root / name
        path.write_text(json.dumps({"turns": [{"events": events} for events in turns]}))
        return f"scripted/{path}"

    def requests(self, name: str = "model.json") -> list[dict[str, Any]]:
        log = self.root / f"{name}.requests.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    def roles(self, request: dict[str, Any]) -> list[str]:
        return [message["role"] for message in request["messages"]]

    async def session(self, *turns: list[dict[str, Any]], **options: Any) -> str:
        model = self.script(*turns)
        return await self.client.create_session(workspace=str(self.workspace), model=model, **options)

    async def events(self, session_id: str) -> list[ClientEvent]:
        return [event async for event in self.client.events(session_id)]

    async def types(self, session_id: str, *, deltas: bool = False) -> list[str]:
        return [
            e.type
            for e in await self.events(session_id)
            if deltas or not e.type.endswith(".delta")
        ]


@asynccontextmanager
async def harness(temporal: Client, store: Store, root: Path, **worker_options: Any) -> AsyncIterator[Harness]:
    task_queue = f"tq-{uuid.uuid4()}"
    worker: Worker = build_worker(temporal, store, task_queue=task_queue, **worker_options)
    client = SessionClient(temporal, store, task_queue=task_queue)
    async with worker:
        yield Harness(client, store, root)
