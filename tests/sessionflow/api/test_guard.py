"""The token rule, the host and origin guards, CORS, and 503 when Temporal or the store is gone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import running_api
from sessionflow.client import SessionClient
from sessionflow.errors import UnsafeBindError
from tests.conftest import Target
from tests.sessionflow.api.conftest import Api
from tests.sessionflow.api.test_routes import error

ROOT = Path(__file__).parents[3]
TOKEN = "s3cret-token-for-tests"


@asynccontextmanager
async def served(client: SessionClient, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        running_api(client, ApiSettings(port=0, **settings)) as url,  # type: ignore[arg-type]
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        yield http


def test_binding_off_loopback_needs_a_token() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        ApiSettings(host=host).check_bind()
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.com"):
        with pytest.raises(UnsafeBindError, match="SESSIONFLOW_API_TOKEN"):
            ApiSettings(host=host).check_bind()
        ApiSettings(host=host, token=TOKEN).check_bind()


def test_serve_refuses_to_start_off_loopback_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONFLOW_API_TOKEN"}
    done = subprocess.run(
        [sys.executable, "-m", "sessionflow.cli", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "SESSIONFLOW_API_TOKEN" in done.stderr


async def test_with_a_token_every_api_route_needs_it(api: Api) -> None:
    async with served(api.h.client, token=TOKEN) as http:
        sid = (await api.http.post("/sessions", json=_new(api))).json()["id"]
        for path in ("/sessions", f"/sessions/{sid}", f"/sessions/{sid}/events"):
            error(await http.get(path), 401, "UnauthorizedError")
            wrong = await http.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.headers["www-authenticate"] == "Bearer"
            error(wrong, 401, "UnauthorizedError")
        error(
            await http.post(f"/sessions/{sid}/prompt", json={"text": "x"}), 401, "UnauthorizedError"
        )
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert (await http.get(f"/sessions/{sid}", headers=bearer)).json()["id"] == sid
        cookie = await http.get("/sessions", headers={"Cookie": f"sessionflow_token={TOKEN}"})
        assert [s["id"] for s in cookie.json()] == [sid]
        # What holds no session data stays open: the schema, health, static assets.
        assert (await http.get("/openapi.json")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
    assert [e.type for e in await api.h.events(sid)] == ["session.created"]


def _new(api: Api) -> dict[str, str]:
    return {"workspace": str(api.h.workspace), "model": api.h.script([{"text": "x"}])}


async def test_without_a_token_only_loopback_names_are_answered(api: Api) -> None:
    rebound = await api.http.get("/sessions", headers={"Host": "evil.example:8765"})
    assert "DNS rebinding" in error(rebound, 403, "ForbiddenError")
    for host in ("localhost:8765", "127.0.0.1", "[::1]:8765"):
        assert (await api.http.get("/sessions", headers={"Host": host})).status_code == 200
    async with served(api.h.client, token=TOKEN) as http:  # a token serves any name
        named = await http.get("/healthz", headers={"Host": "sessionflow.internal"})
        assert named.status_code == 200


async def test_other_origins_cannot_change_sessions(api: Api) -> None:
    sid = (await api.http.post("/sessions", json=_new(api))).json()["id"]
    url = f"/sessions/{sid}/prompt"
    forged = await api.http.post(
        url, json={"text": "rm -rf"}, headers={"Origin": "https://evil.example"}
    )
    assert "SESSIONFLOW_API_CORS_ORIGINS" in error(forged, 403, "ForbiddenError")
    own = api.url  # the API's own page posts with its own origin
    body = {"text": "mine", "wake": False}
    assert (await api.http.post(url, json=body, headers={"Origin": own})).status_code == 200
    async with served(api.h.client, cors_origins="https://app.example") as http:
        preflight = await http.options(
            url,
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
        )
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        allowed = await http.post(
            url, json={**body, "text": "cors"}, headers={"Origin": "https://app.example"}
        )
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    texts = [e.data["prompt"]["text"] for e in await api.h.events(sid) if "prompt" in e.data]
    assert texts == ["mine", "cors"]


async def test_an_unreachable_temporal_server_is_503(api: Api, unused_port: int) -> None:
    temporal = await Client.connect(
        f"127.0.0.1:{unused_port}", lazy=True, data_converter=pydantic_data_converter
    )
    client = SessionClient(temporal, api.h.store, task_queue=api.h.client.task_queue)
    async with served(client) as http:
        created = await http.post("/sessions", json=_new(api))  # the store alone: fine
        sid = created.json()["id"]
        for method, path in (("GET", "status"), ("POST", "resume"), ("POST", "interrupt")):
            answer = await http.request(method, f"/sessions/{sid}/{path}")
            assert "Temporal" in error(answer, 503, "TemporalUnavailableError")
            assert answer.headers["retry-after"] == "1"
        health = await http.get("/healthz")
        assert health.status_code == 503 and health.json()["temporal"] is False


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_unreachable_store_is_503(api: Api, postgres_target: Target) -> None:
    """C4: PostgreSQL behind a proxy this test cuts: every pooled connection dies at once."""
    async with Proxy(5432) as proxy:
        target = Target(
            postgres_target.url.replace(":5432/", f":{proxy.port}/"), postgres_target.schema
        )
        store = await target.open()
        # A queue no worker polls: the harness's workers write to the harness's store, and a
        # session of another store on their queue is refused (issue 32's one store).
        queue = f"{api.h.client.task_queue}-proxied"
        client = SessionClient(api.h.client.temporal, store, task_queue=queue)
        try:
            async with served(client) as http:
                sid = (await http.post("/sessions", json=_new(api))).json()["id"]
                await proxy.cut()
                for path in ("/sessions", f"/sessions/{sid}", f"/sessions/{sid}/messages"):
                    answer = await http.get(path)
                    assert "store" in error(answer, 503, "StoreUnavailableError")
                health = await http.get("/healthz")
                assert health.status_code == 503 and health.json()["store"] is False
        finally:
            await store.close()


class Proxy:
    """A TCP forwarder to a local port that can drop every connection and refuse new ones."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def __aenter__(self) -> Proxy:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cut()

    async def cut(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()

    async def reopen(self) -> None:
        """Accept connections again, on the same port: the database is back."""
        self.writers = []
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self.writers += [writer, up_writer]

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
