"""API fixtures: a session harness (real dev server, in-process worker, both databases) with the
API served over real HTTP by uvicorn on a free port, and a small SSE reader."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import running_api
from store import Store
from tests.workflows.harness import Harness, harness


@dataclass
class Api:
    h: Harness
    url: str
    http: httpx.AsyncClient

    async def session(self, *turns: list[dict[str, Any]]) -> str:
        model = self.h.script(*turns)
        body = {"workspace": str(self.h.workspace), "model": model}
        created = await self.http.post("/sessions", json=body)
        assert created.status_code == 201, created.text
        sid: str = created.json()["id"]
        return sid


@dataclass
class Message:
    event: str = "message"
    data: str = ""
    id: str | None = None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class Reader:
    """Parses an SSE response as it arrives; ``comments`` counts keep-alives."""

    response: httpx.Response
    comments: int = 0
    _lines: AsyncIterator[str] | None = field(default=None, repr=False)

    async def next(self) -> Message:
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        message, seen = Message(), False
        async for line in self._lines:
            if line == "":
                if seen:
                    return message
                continue
            if line.startswith(":"):
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            seen = True
            if name == "data":
                message.data = f"{message.data}\n{value}" if message.data else value
            elif name == "event":
                message.event = value
            elif name == "id":
                message.id = value
        raise EOFError("the stream ended")

    async def keepalive(self) -> None:
        """Wait for the next keep-alive comment (only while no event is due)."""
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        async for line in self._lines:
            if line.startswith(":"):
                self.comments += 1
                return
            assert line == "", f"expected only keep-alives, got {line!r}"
        raise EOFError("the stream ended")

    async def events(self, until: Callable[[Message], bool]) -> list[Message]:
        """Messages up to and including the first one ``until`` accepts."""
        got: list[Message] = []
        while True:
            got.append(await self.next())
            if until(got[-1]):
                return got

    async def rest(self) -> list[Message]:
        """Everything until the server ends the stream."""
        got: list[Message] = []
        while True:
            try:
                got.append(await self.next())
            except EOFError:
                return got


def stored(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.json() for m in messages if m.event == "message"]


def ended(message: Message) -> bool:
    return message.event == "end"


@pytest.fixture
async def api(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> AsyncIterator[Api]:
    async with (
        harness(temporal_env.client, store, tmp_path) as h,
        running_api(h.client, ApiSettings(port=0, keepalive_s=0.2)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        yield Api(h, url, http)
