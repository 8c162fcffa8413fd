"""SDK exceptions and HTTP failures as ``ProviderError``s of the taxonomy (reference §8.2).

The drain retries exactly the retryable kinds (transport, rate_limit, internal), so the mapping is
what decides whether a failure costs the user a retry or a failed turn:

| evidence | kind |
| --- | --- |
| ``insufficient_quota``, billing, credit balance, HTTP 402 | quota |
| HTTP 429, ``rate_limit`` | rate_limit (``retry-after-ms`` / ``retry-after`` parsed) |
| HTTP 401/403, authentication or permission errors | auth |
| context length exceeded, prompt too long | context_overflow |
| content policy, safety system, ``content_filter`` | content_filter |
| HTTP 5xx or 529, ``overloaded``, ``server_error``, ``api_error`` | internal |
| connection refused/reset, timeouts, HTTP 408, a broken stream | transport |
| HTTP 400/404/413/422 | invalid_request |
| an event that is not JSON, or one larger than ``clients.MAX_EVENT_BYTES`` | invalid_output |

Every message names the adapter, the model and the HTTP status when there is one.
"""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx2

from activities.providers.base import ErrorKind, ProviderError

if TYPE_CHECKING:  # the SDKs load with their adapters (seconds of imports a worker may not need)
    import anthropic
    import openai

MAX_DETAIL = 500
# A provider asking for hours would stall a drain for hours: the drain's own backoff is the
# better judge beyond this.
MAX_RETRY_AFTER_MS = 10 * 60 * 1000

_QUOTA = ("insufficient_quota", "exceeded your current quota", "billing", "credit balance")
_RATE = ("rate_limit", "rate limit")
_AUTH = ("authentication_error", "permission_error", "invalid_api_key", "invalid x-api-key")
_OVERFLOW = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "input is too long",
    "too many tokens",
    "reduce the length",
)
_FILTER = (
    "content_filter",
    "content_policy",
    "content policy",
    "content management policy",
    "content filtering",
    "safety system",
    "usage policy",
)
_INTERNAL = ("overloaded", "server_error", "api_error", "internal_error", "internal server")
_HINTS: dict[str, str] = {
    "quota": "Check the account's plan and billing.",
    "rate_limit": "Retry later or lower the request rate.",
    "auth": "Check the API key ({key_env}).",
    "context_overflow": "Compact the session or start a new one.",
    "content_filter": "The provider refused the content; rephrase the request.",
    "internal": "The provider had a problem; retrying usually helps.",
    "transport": "Check the network and the base URL ({base_url}).",
    "invalid_request": "Check the model name and the provider settings.",
    "invalid_output": "The provider sent a malformed stream.",
    "unknown": "",
}


@dataclass(frozen=True)
class Label:
    """Who failed: the adapter, the model, where it lives and which variable holds its key."""

    adapter: str
    model: str
    base_url: str = "the provider's default"
    key_env: str = "the provider's API key variable"

    def __str__(self) -> str:
        return f"{self.adapter} model {self.model}"

    def error(
        self,
        kind: ErrorKind,
        detail: str,
        *,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> ProviderError:
        http = f" (HTTP {status})" if status is not None else ""
        hint = _HINTS.get(kind, "").format(key_env=self.key_env, base_url=self.base_url)
        detail = _short(detail)
        if not detail.endswith((".", "!", "?")):
            detail += "."
        message = f"{self}{http}: {detail}" + (f" {hint}" if hint else "")
        return ProviderError(kind, message, status=status, retry_after_ms=retry_after_ms)


def classify(status: int | None, *evidence: str | None) -> ErrorKind:
    """The taxonomy kind for an HTTP status plus the provider's error type, code and message."""
    text = " ".join(item for item in evidence if item).lower()
    if status == 402 or _has(text, _QUOTA):
        return "quota"
    if status == 429 or _has(text, _RATE):
        return "rate_limit"
    if status in (401, 403) or _has(text, _AUTH):
        return "auth"
    if _has(text, _OVERFLOW):
        return "context_overflow"
    if _has(text, _FILTER):
        return "content_filter"
    return _by_status(status, text)


def _by_status(status: int | None, text: str) -> ErrorKind:
    if (status is not None and status >= 500) or status == 409 or _has(text, _INTERNAL):
        return "internal"
    if status == 408:
        return "transport"
    if (status is not None and 400 <= status < 500) or "invalid_request" in text:
        return "invalid_request"
    return "unknown"


class OversizedEventError(ValueError):
    """A server-sent event grew past the bound the transport holds events to."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a server-sent event grew past {limit} bytes; the stream was cut there")
        self.limit = limit


def translate(error: BaseException, label: Label) -> ProviderError | None:
    """The ``ProviderError`` for an exception, or ``None`` when it is not a provider failure."""
    if isinstance(error, ProviderError):
        return error
    oversized = _oversized(error)
    if oversized is not None:
        return label.error("invalid_output", str(oversized))
    import anthropic
    import openai

    if isinstance(error, openai.APIStatusError | anthropic.APIStatusError):
        return _status_error(error, label)
    if isinstance(error, openai.APIConnectionError | anthropic.APIConnectionError):
        cause = error.__cause__
        detail = f"{error.message} {_describe(cause)}" if cause is not None else error.message
        return label.error("transport", detail)
    if isinstance(error, openai.APIError | anthropic.APIError):
        return error_from_body(error.body, label, fallback=error.message)
    if isinstance(error, httpx2.TransportError | OSError | TimeoutError):
        return label.error("transport", f"the connection failed: {_describe(error)}")
    if isinstance(error, ValueError):
        return label.error("invalid_output", f"an event was not valid JSON: {_describe(error)}")
    if isinstance(error, openai.OpenAIError | anthropic.AnthropicError):
        return label.error(classify(None, str(error)), str(error))
    return None


def _oversized(error: BaseException) -> OversizedEventError | None:
    """The transport's cut of an oversized event, also where an SDK wrapped it (newer
    Anthropic SDKs raise it as an ``APIConnectionError`` caused by it)."""
    seen: BaseException | None = error
    for _ in range(8):  # a cause chain is short; a cycle must not loop
        if seen is None or isinstance(seen, OversizedEventError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _status_error(
    error: openai.APIStatusError | anthropic.APIStatusError, label: Label
) -> ProviderError:
    status = error.status_code
    kind_type, code, message = _fields(error.body)
    # A mid-stream error event arrives on an HTTP 200 response: only its body tells what it is.
    http_status = status if status >= 400 else None
    kind = classify(http_status, kind_type, code, message or error.message)
    retry_after = retry_after_ms(error.response.headers)
    return label.error(
        kind, message or error.message, status=http_status, retry_after_ms=retry_after
    )


def error_from_body(body: object, label: Label, *, fallback: str) -> ProviderError:
    """The error for a failure reported in the stream (``error``, ``response.failed``)."""
    kind_type, code, message = _fields(body)
    return label.error(classify(None, kind_type, code, message or fallback), message or fallback)


def _fields(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` from OpenAI (``{error: {...}}`` or flat) or Anthropic bodies."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if not isinstance(body, dict):
        return None, None, body if isinstance(body, str) else None
    return _text(body.get("type")), _text(body.get("code")), _text(body.get("message"))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value)


def retry_after_ms(headers: Any) -> int | None:
    """``retry-after-ms`` (OpenAI) or ``retry-after`` in seconds or as an HTTP date."""
    milliseconds = _header_number(headers, "retry-after-ms")
    if milliseconds is not None:
        return _bounded(milliseconds)
    raw = headers.get("retry-after") if headers is not None else None
    if not raw:
        return None
    seconds = _header_number(headers, "retry-after")
    if seconds is not None:
        return _bounded(seconds * 1000)
    try:
        when = email.utils.parsedate_to_datetime(raw).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return _bounded((when - time.time()) * 1000)


def _header_number(headers: Any, name: str) -> float | None:
    raw = headers.get(name) if headers is not None else None
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value == value else None  # NaN is not a delay


def _bounded(milliseconds: float) -> int:
    return int(min(max(milliseconds, 0.0), MAX_RETRY_AFTER_MS))


def _has(text: str, markers: tuple[str, ...]) -> bool:
    return any(marker in text for marker in markers)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."
