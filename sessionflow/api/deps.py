"""Dependencies of the routes: the client the app was built with, and ids checked at the edge."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from sessionflow.api.config import ApiSettings
from sessionflow.client import SessionClient
from sessionflow.ids import validate_id


def get_client(request: Request) -> SessionClient:
    client: SessionClient = request.app.state.client
    return client


def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def session_id(
    session_id: Annotated[str, Path(description="A session id, e.g. ses_0193a1b2c3d4e5f6a7b8c9")],
) -> str:
    """Validated exactly as the SDK validates it (``InvalidIdError``, 422, before any I/O)."""
    return validate_id(session_id)


Client = Annotated[SessionClient, Depends(get_client)]
Settings = Annotated[ApiSettings, Depends(get_settings)]
SessionId = Annotated[str, Depends(session_id)]
