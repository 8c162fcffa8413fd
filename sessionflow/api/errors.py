"""Errors as HTTP: one JSON shape, ``{"error": {"type", "message", "field"}}``, one status each.

``type`` is the class name from the error taxonomy (``sessionflow/errors.py``): a client can
branch on it exactly as Python code branches on the exception. Conditions only HTTP has take
names in the same style:

    UnauthorizedError         401  no or wrong bearer token
    ForbiddenError            403  a browser request from an origin that is not allowed
    NotFoundError             404  no such route (an unknown session is SessionNotFoundError)
    MethodNotAllowedError     405
    TemporalUnavailableError  503  the Temporal server cannot be reached; retry
    (NoWorkerError is 503 too: no worker polls the session's task queue; start one, retry)
    InternalError             500  a defect; the server log has the traceback
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from temporalio.service import RPCError, RPCStatusCode

from sessionflow import errors
from sessionflow.agents import UnknownAgentError

log = logging.getLogger(__name__)

# First match wins: subclasses before their bases.
STATUSES: tuple[tuple[type[Exception], int], ...] = (
    (errors.PayloadTooLargeError, 413),
    (errors.InvalidInputError, 422),
    (errors.NotFoundError, 404),
    (errors.ConflictError, 409),
    (errors.ClaimError, 409),
    (errors.StoreUnavailableError, 503),
    (errors.StoreError, 500),
    # Work waits for a worker: the request is not lost (``sent`` says so), retry once one runs.
    (errors.NoWorkerError, 503),
    # The session's host has no live worker: start one there, or move the session.
    (errors.HostUnavailableError, 503),
)
HTTP_TYPES = {401: "UnauthorizedError", 403: "ForbiddenError", 404: "NotFoundError"}
HTTP_TYPES[405] = "MethodNotAllowedError"
_TEMPORAL_DOWN = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED)
# Handled where a route raised them (no traceback, no re-raise): the answer is 503, or, for one
# that turns out not to be an outage, the 500 of a defect.
_INFRASTRUCTURE: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
    RPCError,
    RuntimeError,
)


class ApiError(BaseModel):
    type: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):
    error: ApiError


# For the OpenAPI document: every route may answer with these.
RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 404, 409, 413, 422, 503)
}


def error_response(
    status: int, type_: str, message: str, *, field: str | None = None, headers: Any = None
) -> JSONResponse:
    body = ErrorBody(error=ApiError(type=type_, message=message, field=field))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    """Map the taxonomy, request validation and infrastructure failures to statuses."""
    app.add_exception_handler(errors.SessionflowError, _taxonomy)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)


async def _taxonomy(request: Request, error: Exception) -> JSONResponse:
    status = next((code for cls, code in STATUSES if isinstance(error, cls)), 500)
    field = _taxonomy_field(error)
    headers = {"Retry-After": "1"} if status == 503 else None
    return error_response(status, type(error).__name__, str(error), field=field, headers=headers)


def _taxonomy_field(error: Exception) -> str | None:
    if isinstance(error, errors.InvalidIdError):
        return f"{error.kind.replace(' ', '_')}_id"
    if isinstance(error, UnknownAgentError):
        return "agent"
    if isinstance(error, errors.InvalidInputError):
        return error.field
    return None


async def _validation(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = error.errors()
    fields = [_field(problem["loc"]) for problem in problems]
    message = "; ".join(
        f"{name or 'body'}: {problem['msg']}"
        for name, problem in zip(fields, problems, strict=True)
    )
    return error_response(422, "InvalidInputError", message, field=fields[0] if fields else None)


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if part not in ("body", "query", "path", "header"))


async def _http(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    type_ = HTTP_TYPES.get(error.status_code, "HTTPError")
    return error_response(error.status_code, type_, str(error.detail), headers=error.headers)


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    unavailable = unavailable_response(error)
    if unavailable is not None:
        return unavailable
    log.exception("unexpected error serving %s %s", request.method, request.url.path)
    return error_response(500, "InternalError", f"Internal error: {type(error).__name__}")


def unavailable_response(error: BaseException) -> JSONResponse | None:
    """503 for a store or Temporal server that cannot be reached, else None."""
    retry = {"Retry-After": "1"}
    if isinstance(error, sa.exc.OperationalError | sa.exc.InterfaceError | sa.exc.TimeoutError):
        message = f"The store cannot be reached: {_short(error)}. Retry shortly."
        return error_response(503, "StoreUnavailableError", message, headers=retry)
    if isinstance(error, RPCError) and error.status in _TEMPORAL_DOWN:
        message = f"The Temporal server cannot be reached: {_short(error)}. Retry shortly."
        return error_response(503, "TemporalUnavailableError", message, headers=retry)
    if isinstance(error, RuntimeError) and str(error).startswith("Failed client connect"):
        message = f"The Temporal server cannot be reached: {_short(error)}. Retry shortly."
        return error_response(503, "TemporalUnavailableError", message, headers=retry)
    return None


def _short(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).splitlines()[0] if str(error) else ""
    return text[:300] or type(error).__name__
