"""The API's settings, read once at the edge, and the bind rule.

Environment variables (all optional):

- ``SESSIONFLOW_API_HOST`` (``127.0.0.1``) and ``SESSIONFLOW_API_PORT`` (8765): where to listen.
- ``SESSIONFLOW_API_TOKEN``: the bearer token every request must carry. Required when the host is
  not a loopback address: the API runs an agent's tools, so it is never open to a network.
- ``SESSIONFLOW_API_CORS_ORIGINS``: comma-separated origins allowed to call the API from a
  browser (default none: only the API's own page).
- ``SESSIONFLOW_API_MAX_BODY_BYTES``: the largest request body (default 8 MiB, room for a prompt
  at the store's 4 MiB event cap once JSON-escaped).
- ``SESSIONFLOW_API_KEEPALIVE_S``: seconds between keep-alive comments on an idle stream (15).
- ``SESSIONFLOW_TEMPORAL_UI_URL``: the Temporal UI the page links each session's workflow to
  (default: the dev server's, ``http://<temporal host>:8233``).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionflow.errors import UnsafeBindError
from sessionflow.settings import from_environment

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
DEFAULT_PORT = 8765


class ApiSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    token: str | None = None
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    keepalive_s: float = Field(default=15.0, gt=0)
    temporal_ui: str | None = None
    namespace: str = "default"

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(origin.strip() for origin in value.split(",") if origin.strip())
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> ApiSettings:
        env = os.environ if environ is None else environ
        return from_environment(cls, _VARIABLES, env, overrides)

    def check_bind(self) -> None:
        """Refuse to listen beyond loopback without a token (``UnsafeBindError``)."""
        if not self.token and not is_loopback(self.host):
            raise UnsafeBindError(self.host)


_VARIABLES = (
    ("host", "SESSIONFLOW_API_HOST"),
    ("port", "SESSIONFLOW_API_PORT"),
    ("token", "SESSIONFLOW_API_TOKEN"),
    ("cors_origins", "SESSIONFLOW_API_CORS_ORIGINS"),
    ("max_body_bytes", "SESSIONFLOW_API_MAX_BODY_BYTES"),
    ("keepalive_s", "SESSIONFLOW_API_KEEPALIVE_S"),
    ("temporal_ui", "SESSIONFLOW_TEMPORAL_UI_URL"),
)


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
