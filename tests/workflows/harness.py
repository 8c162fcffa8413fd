"""A session harness for drain tests: a store, a worker on a fresh task queue, a client, scripts."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from sessionflow.client import ClientEvent, SessionClient
from store import Store
from store.events import StoredEvent
from tests.invariants import check_store
from tests.workflows.tools import Gate, registry
from worker import build_worker


def call(call_id: str, name: str = "echo", **tool_input: object) -> dict[str, Any]:
    """A scripted local tool call."""
    return {"tool_call": {"id": call_id, "name": name, "input": tool_input}}


class Harness:
    def __init__(self, client: SessionClient, store: Store, root: Path) -> None:
        self.client = client
        self.store = store
        self.root = root
        self.workspace = root / "workspace"
        self.workspace.mkdir(exist_ok=True)
        self.gate = Gate()
        self.worker_options: dict[str, Any] = {}

    def worker(self) -> Worker:
        """An in-process worker on this harness's task queue (an async context manager)."""
        # The suite keeps workflow code honest in the sandbox (see build_worker).
        options = {"tools": registry(self.gate), "sandboxed": True, **self.worker_options}
        return build_worker(
            self.client.temporal, self.store, task_queue=self.client.task_queue, **options
        )

    def gate_file(self, name: str) -> str:
        return str(self.root / f"{name}.gate")

    def open_gate(self, name: str) -> None:
        (self.root / f"{name}.gate").touch()

    async def until(self, predicate: Any, timeout: float = 20.0) -> None:
        """Poll an async or sync predicate until it holds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            await asyncio.sleep(0.02)

    async def messages(self, session_id: str) -> list[Any]:
        return await self.client.messages(session_id)

    def script(
        self,
        *turns: list[dict[str, Any]],
        name: str = "model.json",
        price: dict[str, float] | None = None,
    ) -> str:
        path = self.root / name
        script: dict[str, Any] = {"turns": [{"events": events} for events in turns]}
        if price is not None:
            script["price"] = price
        path.write_text(json.dumps(script))
        return f"scripted/{path}"

    def requests(self, name: str = "model.json") -> list[dict[str, Any]]:
        log = self.root / f"{name}.requests.jsonl"
        if not log.exists():
            return []
        # A worker process may be writing the last line as it is read: only whole lines count.
        whole = log.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in whole.splitlines()]

    def roles(self, request: dict[str, Any]) -> list[str]:
        return [message["role"] for message in request["messages"]]

    async def session(
        self, *turns: list[dict[str, Any]], price: dict[str, float] | None = None, **options: Any
    ) -> str:
        model = self.script(*turns, price=price)
        return await self.client.create_session(
            workspace=str(self.workspace), model=model, **options
        )

    async def events(self, session_id: str) -> list[ClientEvent]:
        return [event async for event in self.client.events(session_id)]

    async def types(self, session_id: str, *, deltas: bool = False) -> list[str]:
        return [
            e.type for e in await self.events(session_id) if deltas or not e.type.endswith(".delta")
        ]


@asynccontextmanager
async def harness(
    temporal: Client,
    store: Store,
    root: Path,
    *,
    start_worker: bool = True,
    breaks: Collection[str] = (),
    **worker_options: Any,
) -> AsyncIterator[Harness]:
    """A harness on a fresh task queue, with an in-process worker unless ``start_worker=False``.

    On the way out every session in the store is checked against the log invariants
    (``tests/invariants.py``), except those the test says it ``breaks`` on purpose.
    """
    task_queue = f"tq-{uuid.uuid4()}"
    client = SessionClient(temporal, store, task_queue=task_queue)
    running = Harness(client, store, root)
    running.worker_options = worker_options
    if start_worker:
        async with running.worker():
            yield running
    else:
        yield running
    await check_store(store, allowed=breaks)


async def follow_busy_period(store: Store, sid: str, into: list[StoredEvent]) -> None:
    """Follow ``sid`` live from its first event until its busy period succeeds."""
    async for item in store.events.log(sid, follow=True):
        if isinstance(item, StoredEvent):
            into.append(item)
            if item.data.type == "session.execution.succeeded":
                return
