"""``sessionflow serve``: the API on uvicorn, over a client connected from the settings."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import uvicorn
from temporalio.client import Client

from sessionflow.api.app import create_app
from sessionflow.api.config import ApiSettings

__all__ = ["ApiSettings", "dev_api", "event_loop", "running_api", "serve"]
from sessionflow.client import SessionClient
from sessionflow.errors import InvalidInputError
from store import Store


def event_loop() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop ``sessionflow serve`` runs in: uvloop's when it is installed (``uvicorn[standard]``
    brings it), else None, asyncio's own. With 200 SSE subscribers on one session every commit is
    200 socket writes; uvloop's transports cost a fraction of asyncio's per write."""
    if importlib.util.find_spec("uvloop") is None:
        return None
    import uvloop

    return uvloop.new_event_loop


def ui_base(temporal_address: str, settings: ApiSettings) -> str:
    """The Temporal UI the page links to: configured, else the dev server's beside Temporal."""
    if settings.temporal_ui:
        return settings.temporal_ui.rstrip("/")
    return f"http://{temporal_address.rsplit(':', 1)[0]}:8233"


def listen(settings: ApiSettings) -> socket.socket:
    """The listening socket (port 0 picks a free one); ``InvalidInputError`` if it is taken."""
    settings.check_bind()
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it. Without it a kept-alive connection's answers (headers,
    # then body: two writes) wait out the client's delayed ACK: 40 ms per request, measured.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((settings.host.strip("[]"), settings.port))
    except OSError as error:
        sock.close()
        raise InvalidInputError(
            f"Cannot listen on {settings.host}:{settings.port} ({error.strerror}): pass --port "
            f"or set SESSIONFLOW_API_PORT to a free port."
        ) from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def running_api(
    client: SessionClient,
    settings: ApiSettings,
    *,
    sock: socket.socket | None = None,
    http: Literal["auto", "h11", "httptools"] = "auto",
) -> AsyncIterator[str]:
    """Serve the API in this event loop until the block ends; yields its base URL.

    The socket is bound before the block starts, so the URL is reachable at once. ``http`` is
    uvicorn's protocol: ``auto`` (httptools when installed, else h11), ``httptools`` or ``h11``.
    """
    sock = sock or listen(settings)
    family = sock.family
    config = uvicorn.Config(
        create_app(client, settings),
        # ``auto`` is httptools when installed (``uvicorn[standard]``), else h11: httptools
        # frames a chunked write in C, h11's state machine costs more per write than the send.
        http=http,
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


@asynccontextmanager
async def dev_api(
    temporal: Client, store: Store, *, task_queue: str, temporal_ui: str
) -> AsyncIterator[str]:
    """The API beside the embedded stack (``sessionflow dev``, ``make demo``), over its client
    and store: on the configured port, or on a free one when that is taken."""
    client = SessionClient(temporal, store, task_queue=task_queue)
    settings = ApiSettings.from_env(temporal_ui=temporal_ui)
    try:
        sock = listen(settings)
    except InvalidInputError:
        sock = listen(settings.model_copy(update={"port": 0}))
    async with running_api(client, settings, sock=sock) as url:
        yield url


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
