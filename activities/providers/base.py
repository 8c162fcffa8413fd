"""The provider protocol and the normalized stream it yields (DESIGN "Providers").

An adapter turns one ``ProviderRequest`` into an async stream of ``StreamEvent``s, or raises
``ProviderError`` for a raw failure (HTTP status, reset connection) with its taxonomy kind, so the
drain can retry exactly the retryable ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from sessionflow.models.common import ErrorType, Model, ModelRef, SessionError

# --- the request --------------------------------------------------------------------------------


class TextPartIn(Model):
    type: Literal["text"] = "text"
    text: str


class ImagePartIn(Model):
    type: Literal["image"] = "image"
    media_type: str
    data: str
    filename: str | None = None


class ReasoningPartIn(Model):
    type: Literal["reasoning"] = "reasoning"
    text: str
    provider_metadata: dict[str, Any] | None = None


class ToolCallPartIn(Model):
    type: Literal["tool-call"] = "tool-call"
    call_id: str
    name: str
    input: Any
    provider_executed: bool = False
    provider_metadata: dict[str, Any] | None = None


class ToolResultPartIn(Model):
    type: Literal["tool-result"] = "tool-result"
    call_id: str
    name: str
    output: Any
    is_error: bool = False
    provider_executed: bool = False
    provider_metadata: dict[str, Any] | None = None


RequestPart = Annotated[
    TextPartIn | ImagePartIn | ReasoningPartIn | ToolCallPartIn | ToolResultPartIn,
    Field(discriminator="type"),
]


class RequestMessage(Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: tuple[RequestPart, ...]


class ToolSpec(Model):
    name: str
    description: str
    input_schema: dict[str, Any]


class ProviderRequest(Model):
    session_id: str
    request_index: int = Field(description="0-based count of this session's provider requests")
    model: ModelRef
    system: tuple[str, ...] = ()
    messages: tuple[RequestMessage, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: Literal["auto", "none"] | None = None
    prompt_cache_key: str | None = None
    # A cap of this request's own (a compaction's summary); the provider settings' otherwise.
    max_output_tokens: int | None = None


# --- the stream ---------------------------------------------------------------------------------


class TextStart(Model):
    kind: Literal["text-start"] = "text-start"
    id: str


class TextDelta(Model):
    kind: Literal["text-delta"] = "text-delta"
    id: str
    delta: str


class TextEnd(Model):
    kind: Literal["text-end"] = "text-end"
    id: str


class ReasoningStart(Model):
    kind: Literal["reasoning-start"] = "reasoning-start"
    id: str
    metadata: dict[str, Any] | None = None


class ReasoningDelta(Model):
    kind: Literal["reasoning-delta"] = "reasoning-delta"
    id: str
    delta: str
    metadata: dict[str, Any] | None = None


class ReasoningEnd(Model):
    kind: Literal["reasoning-end"] = "reasoning-end"
    id: str
    metadata: dict[str, Any] | None = None


class ToolInputStart(Model):
    kind: Literal["tool-input-start"] = "tool-input-start"
    id: str
    name: str


class ToolInputDelta(Model):
    kind: Literal["tool-input-delta"] = "tool-input-delta"
    id: str
    delta: str


class ToolInputEnd(Model):
    kind: Literal["tool-input-end"] = "tool-input-end"
    id: str


class ToolCall(Model):
    kind: Literal["tool-call"] = "tool-call"
    call_id: str
    name: str
    input: Any
    provider_executed: bool = False
    metadata: dict[str, Any] | None = None


class ToolResult(Model):
    kind: Literal["tool-result"] = "tool-result"
    call_id: str
    name: str
    result: Any
    is_error: bool = False
    provider_executed: bool = True
    metadata: dict[str, Any] | None = None


class ToolErrorEvent(Model):
    kind: Literal["tool-error"] = "tool-error"
    call_id: str
    name: str
    message: str


class Usage(Model):
    """Provider counts as reported: ``input`` includes cached tokens, ``output`` reasoning."""

    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache_read: int = 0
    cache_write: int = 0


class StepFinish(Model):
    kind: Literal["step-finish"] = "step-finish"
    reason: str
    usage: Usage = Usage()


class ProviderErrorEvent(Model):
    kind: Literal["provider-error"] = "provider-error"
    message: str
    classification: str | None = None


StreamEvent = Annotated[
    TextStart
    | TextDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolInputStart
    | ToolInputDelta
    | ToolInputEnd
    | ToolCall
    | ToolResult
    | ToolErrorEvent
    | StepFinish
    | ProviderErrorEvent,
    Field(discriminator="kind"),
]

# --- failures -----------------------------------------------------------------------------------

ErrorKind = Literal[
    "transport",
    "rate_limit",
    "internal",
    "invalid_request",
    "auth",
    "quota",
    "content_filter",
    "context_overflow",
    "invalid_output",
    "no_route",
    "unknown",
]

_ERROR_TYPES: dict[str, ErrorType] = {
    "transport": "provider.transport",
    "rate_limit": "provider.rate-limit",
    "internal": "provider.internal",
    "invalid_request": "provider.invalid-request",
    "auth": "provider.auth",
    "quota": "provider.quota",
    "content_filter": "provider.content-filter",
    "context_overflow": "provider.context-overflow",
    "invalid_output": "provider.invalid-output",
    "no_route": "provider.no-route",
    "unknown": "provider.unknown",
}
RETRYABLE: frozenset[str] = frozenset({"transport", "rate_limit", "internal"})


class ProviderError(Exception):
    """A raw provider failure (no stream, or a broken one) with its taxonomy kind."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after_ms: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after_ms = retry_after_ms

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def session_error(self) -> SessionError:
        return SessionError(type=_ERROR_TYPES[self.kind], message=self.message, status=self.status)


class Provider(Protocol):
    def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        """Stream one model turn; raise ``ProviderError`` for raw failures."""
        ...


@runtime_checkable
class Opening(Protocol):
    """An adapter with something to load before its stream can open (the scripted provider's
    script). ``open`` runs before the request is counted, so a failure to load consumes no
    turn and promotes nothing; the stream then uses what ``open`` loaded."""

    def open(self) -> None: ...


def open_provider(provider: Provider) -> Provider:
    """``provider``, opened if it has anything to open; raises what failed to load."""
    if isinstance(provider, Opening):
        provider.open()
    return provider
