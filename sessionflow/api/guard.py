"""What every request passes before a route sees it: the body cap, the host and origin rules,
and the token.

- A body above ``max_body_bytes`` is refused with 413 (by its Content-Length, or as soon as a
  chunked body crosses the cap), before any of it is parsed.
- Without a token (loopback only, see ``ApiSettings.check_bind``) the API answers only requests
  addressed to a loopback name, so a web page cannot reach it by rebinding its own DNS name to
  127.0.0.1.
- A browser request that changes something (any method but GET, HEAD, OPTIONS) from an origin
  other than the API's own or a configured CORS origin is refused (403): a page elsewhere cannot
  post prompts to an agent on your machine.
- With a token, API routes require ``Authorization: Bearer <token>`` or the page's
  ``sessionflow_token`` cookie (SameSite=Strict, so other sites never send it).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionflow.api.config import ApiSettings, is_loopback
from sessionflow.api.errors import error_response
from sessionflow.errors import PayloadTooLargeError

TOKEN_COOKIE = "sessionflow_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Guard:
    """Pure ASGI middleware, so a refused body is never read and streams are left alone."""

    def __init__(self, app: ASGIApp, settings: ApiSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope["method"], headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self._capped(scope, receive, send)

    def _refusal(self, method: str, headers: dict[str, str]) -> Any:
        host = headers.get("host", "")
        if not self.settings.token and not is_loopback(_hostname(host)):
            return error_response(
                403,
                "ForbiddenError",
                f"Host {host!r} is not a loopback name: without SESSIONFLOW_API_TOKEN this API "
                f"only answers requests to 127.0.0.1 or localhost (a guard against DNS "
                f"rebinding). Set a token to serve other names.",
            )
        origin = headers.get("origin")
        if method not in SAFE_METHODS and origin and not self._allowed(origin, host):
            return error_response(
                403,
                "ForbiddenError",
                f"Origin {origin!r} may not change sessions: add it to "
                f"SESSIONFLOW_API_CORS_ORIGINS if it is yours.",
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.settings.max_body_bytes:
            return _too_large(int(length), self.settings.max_body_bytes)
        return None

    def _allowed(self, origin: str, host: str) -> bool:
        own = urlsplit(origin).netloc == host
        return own or origin in self.settings.cors_origins or "*" in self.settings.cors_origins

    async def _capped(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A chunked body that crosses the cap gets its 413 at once; the app sees a disconnect."""
        limit, received, refused = self.settings.max_body_bytes, 0, False

        async def capped_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    await _too_large(received, limit)(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, capped_receive, guarded_send)


def _too_large(size: int, limit: int) -> Any:
    error = PayloadTooLargeError(
        "The request body", size, limit, setting="SESSIONFLOW_API_MAX_BODY_BYTES"
    )
    return error_response(413, type(error).__name__, str(error))


def _hostname(host: str) -> str:
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def authorized(request: Request) -> bool:
    token: str | None = request.app.state.settings.token
    if not token:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() != "bearer" or not offered:
        offered = request.cookies.get(TOKEN_COOKIE, "")
    return bool(offered) and hmac.compare_digest(offered.encode(), token.encode())


def require_token(request: Request) -> None:
    """The dependency of every API route."""
    if not authorized(request):
        raise HTTPException(
            401,
            "Missing or wrong token: send 'Authorization: Bearer <SESSIONFLOW_API_TOKEN>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )
