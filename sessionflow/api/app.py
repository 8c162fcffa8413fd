"""``create_app``: the ASGI app over one connected ``SessionClient`` (the caller owns it)."""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from sessionflow.api import errors
from sessionflow.api.config import ApiSettings
from sessionflow.api.guard import Guard, require_token
from sessionflow.api.routes import control, events, health, hosts, page, requests, sessions
from sessionflow.api.stream import Streams
from sessionflow.client import SessionClient

STATIC = Path(__file__).parent / "static"


def create_app(client: SessionClient, settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    app = FastAPI(
        title="sessionflow",
        summary="Durable agent sessions over HTTP, with resumable event streams.",
        version="1",
        responses=errors.RESPONSES,
    )
    app.state.client, app.state.settings, app.state.streams = client, settings, Streams(client)
    errors.install(app)
    auth = [Depends(require_token)]
    for router in (sessions.router, control.router, requests.router, events.router, hosts.router):
        app.include_router(router, dependencies=auth)
    app.include_router(health.router)
    app.include_router(page.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Last-Event-ID"],
            expose_headers=["Location"],
        )
    # Outermost: a refused request never reaches CORS, routing or body parsing.
    app.add_middleware(Guard, settings=settings)
    return app
