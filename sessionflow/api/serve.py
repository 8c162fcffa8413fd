"""``sessionflow serve``: the API on uvicorn, over a client connected from the settings."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn

from sessionflow.api.app import create_app
from sessionflow.api.config import ApiSettings

__all__ = ["ApiSettings", "running_api", "serve"]
from sessionflow.client import SessionClient


def ui_base(temporal_address: str, settings: ApiSettings) -> str:
    """The Temporal UI the page links to: configured, else the dev server's beside Temporal."""
    if settings.temporal_ui:
        return settings.temporal_ui.rstrip("/")
    return f"http://{temporal_address.rsplit(':', 1)[0]}:8233"


@asynccontextmanager
async def running_api(client: SessionClient, settings: ApiSettings) -> AsyncIterator[str]:
    """Serve the API in this event loop until the block ends; yields its base URL.

    The socket is bound before the block starts (port 0 picks a free one), so the URL is
    reachable at once.
    """
    settings.check_bind()
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it. Without it a kept-alive connection's answers (headers,
    # then body: two writes) wait out the client's delayed ACK: 40 ms per request, measured.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((settings.host.strip("[]"), settings.port))
    sock.listen(2048)
    sock.setblocking(False)
    config = uvicorn.Config(
        create_app(client, settings),
        log_level="warning",
        timeout_graceful_shutdown=1,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raise what stopped it
                raise RuntimeError("the API server stopped while starting")
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        host = f"[{settings.host.strip('[]')}]" if family == socket.AF_INET6 else settings.host
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def serve(
    temporal_address: str,
    database_url: str | None,
    task_queue: str,
    settings: ApiSettings,
) -> None:
    """Run until cancelled (Ctrl-C); prints where the API and its page are."""
    settings.check_bind()  # before connecting anywhere: a refused bind costs nothing
    if not settings.temporal_ui:
        settings = settings.model_copy(update={"temporal_ui": ui_base(temporal_address, settings)})
    client = await SessionClient.connect(
        temporal_address=temporal_address, database_url=database_url, task_queue=task_queue
    )
    try:
        async with running_api(client, settings) as url:
            print(f"sessionflow API and live page: {url}  (OpenAPI: {url}/docs)", flush=True)
            await asyncio.Event().wait()
    finally:
        await client.close()
