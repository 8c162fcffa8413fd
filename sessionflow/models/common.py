"""Value models used inside events and messages."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ErrorType = Literal[
    "provider.rate-limit",
    "provider.auth",
    "provider.quota",
    "provider.content-filter",
    "provider.transport",
    "provider.internal",
    "provider.invalid-output",
    "provider.invalid-request",
    "provider.context-overflow",
    "provider.no-route",
    "provider.unknown",
    "permission.rejected",
    "tool.execution",
    "tool.unknown",
    "tool.stale",
    "tool.result-missing",
    "tool.input-json",
    "tool.outcome-unknown",
    "tool.host-unavailable",
    "claim.timeout",
    "aborted",
    "compaction.failed",
    "compaction.interrupted",
    "unknown",
]

Delivery = Literal["steer", "queue"]


class Model(BaseModel):
    """Base of value models: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class SessionError(Model):
    """The error taxonomy of reference §8.2: ``{type, message, status?}``."""

    type: ErrorType
    message: str
    status: int | None = None


class CacheTokens(Model):
    read: int = 0
    write: int = 0


class Tokens(Model):
    input: int = 0
    output: int = 0
    reasoning: int = 0
    cache: CacheTokens = CacheTokens()

    @field_validator("input", "output", "reasoning", mode="before")
    @classmethod
    def _finite_non_negative(cls, value: Any) -> int:
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            return 0
        return int(value)


# The providers a worker has adapters for (``activities/providers/registry.py``).
PROVIDER_IDS = ("openai", "openai-chat", "anthropic", "scripted")


class ModelRef(Model):
    """A model as ``<provider>/<id>``, e.g. ``scripted/demo.json`` or ``anthropic/claude``."""

    provider_id: str
    id: str
    variant: str | None = None

    @classmethod
    def parse(cls, ref: str) -> ModelRef:
        provider, sep, model = ref.partition("/")
        if not sep or not provider or not model:
            raise ValueError(
                f"Invalid model reference {ref!r}: use <provider>/<model>, "
                f"e.g. scripted/demo.json or anthropic/claude-sonnet-4"
            )
        return cls(provider_id=provider, id=model)

    def __str__(self) -> str:
        return f"{self.provider_id}/{self.id}"


class FileAttachment(Model):
    mime: str
    data: str = Field(description="base64 content")
    name: str | None = None
    description: str | None = None


class Prompt(Model):
    """What a user sends: text plus optional attachments."""

    text: str
    files: tuple[FileAttachment, ...] = ()
    metadata: dict[str, Any] | None = None


class TextContent(Model):
    type: Literal["text"] = "text"
    text: str


class FileContent(Model):
    type: Literal["file"] = "file"
    uri: str
    mime: str
    name: str | None = None


ContentPart = TextContent | FileContent


class Limits(Model):
    """A model's context window and output limit, in tokens."""

    context: int = Field(gt=0)
    output: int = Field(gt=0)

    @field_validator("output")
    @classmethod
    def _fits(cls, output: int, info: Any) -> int:
        context = info.data.get("context")
        if context is not None and output >= context:
            raise ValueError(
                f"the output limit ({output}) must be smaller than the context window ({context})"
            )
        return output


class CompactionSettings(Model):
    """How a session compacts its history (reference §4.9). Stored in the session's settings.

    ``auto``: compact before a request that would not fit. ``buffer``: tokens kept free (clamped
    to a quarter of the window for small windows). ``keep_tokens``: recent history kept verbatim
    (default: a quarter of the window). ``model``: the summary call's model (default: the
    session's).
    """

    auto: bool = True
    buffer: int = Field(default=20_000, ge=0)
    keep_tokens: int | None = Field(default=None, ge=0)
    model: str | None = None
