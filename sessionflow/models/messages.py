"""Messages and parts: the projected history of a session (reference §1.8).

These models are mutable because the projector updates them in place inside the event
transaction; readers get them from ``store.messages``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from sessionflow.models.common import (
    ContentPart,
    FileAttachment,
    ModelRef,
    SessionError,
    Tokens,
)
from sessionflow.models.permissions import PermissionRequest


class Mutable(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=False)


# --- parts --------------------------------------------------------------------------------------


class TextPart(Mutable):
    type: Literal["text"] = "text"
    ordinal: int
    text: str = ""


class ReasoningPart(Mutable):
    type: Literal["reasoning"] = "reasoning"
    ordinal: int
    text: str = ""
    state: dict[str, Any] | None = None
    time_created: int = 0
    time_completed: int | None = None


class ToolPending(Mutable):
    status: Literal["pending"] = "pending"
    input: str = ""


class ToolRunning(Mutable):
    status: Literal["running"] = "running"
    input: dict[str, Any] = Field(default_factory=dict)
    structured: dict[str, Any] = Field(default_factory=dict)
    content: list[ContentPart] = Field(default_factory=list)
    # The permission ask or question the call waits on, until it is answered.
    asked: PermissionRequest | None = None


class ToolCompleted(Mutable):
    status: Literal["completed"] = "completed"
    input: dict[str, Any] = Field(default_factory=dict)
    structured: dict[str, Any] = Field(default_factory=dict)
    content: list[ContentPart] = Field(default_factory=list)
    output_paths: list[str] = Field(default_factory=list)
    result: Any = None


class ToolError(Mutable):
    status: Literal["error"] = "error"
    error: SessionError
    input: dict[str, Any] = Field(default_factory=dict)
    structured: dict[str, Any] = Field(default_factory=dict)
    content: list[ContentPart] = Field(default_factory=list)
    result: Any = None


ToolState = Annotated[
    ToolPending | ToolRunning | ToolCompleted | ToolError, Field(discriminator="status")
]


class ToolTimes(Mutable):
    created: int
    ran: int | None = None
    completed: int | None = None


class ToolPart(Mutable):
    type: Literal["tool"] = "tool"
    call_id: str
    name: str
    executed: bool = False
    provider_state: dict[str, Any] | None = None
    provider_result_state: dict[str, Any] | None = None
    time: ToolTimes
    state: ToolState = Field(default_factory=ToolPending)

    @property
    def settled(self) -> bool:
        return self.state.status in ("completed", "error")


AssistantPart = Annotated[TextPart | ReasoningPart | ToolPart, Field(discriminator="type")]


# --- messages -----------------------------------------------------------------------------------


class MessageBase(Mutable):
    id: str
    session_id: str
    seq: int
    time_created: int


class UserMessage(MessageBase):
    type: Literal["user"] = "user"
    text: str
    files: list[FileAttachment] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None


class SyntheticMessage(MessageBase):
    type: Literal["synthetic"] = "synthetic"
    text: str
    description: str | None = None
    metadata: dict[str, Any] | None = None


class SystemMessage(MessageBase):
    type: Literal["system"] = "system"
    text: str


class RetryInfo(Mutable):
    attempt: int
    at: int
    error: SessionError


class AssistantMessage(MessageBase):
    type: Literal["assistant"] = "assistant"
    agent: str
    model: ModelRef
    time_completed: int | None = None
    content: list[AssistantPart] = Field(default_factory=list)
    finish: str | None = None
    error: SessionError | None = None
    cost: float | None = None  # USD; None when unpriced (or not ended)
    tokens: Tokens | None = None
    retry: RetryInfo | None = None
    files: list[str] = Field(default_factory=list)

    def tool(self, call_id: str) -> ToolPart | None:
        """The latest tool part with this call id inside this message (reference §6)."""
        for part in reversed(self.content):
            if isinstance(part, ToolPart) and part.call_id == call_id:
                return part
        return None


class CompactionMessage(MessageBase):
    type: Literal["compaction"] = "compaction"
    input_id: str | None = None
    reason: Literal["auto", "manual"] = "manual"
    summary: str = ""
    recent: str = ""
    status: Literal["queued", "running", "completed", "failed"] = "queued"
    # The newest message it covers: the history a request sees is this message, then the
    # messages after this seq (those up to it are in its summary and recent context).
    boundary_seq: int | None = None


Message = Annotated[
    UserMessage | SyntheticMessage | SystemMessage | AssistantMessage | CompactionMessage,
    Field(discriminator="type"),
]

MESSAGE_ADAPTER: TypeAdapter[
    UserMessage | SyntheticMessage | SystemMessage | AssistantMessage | CompactionMessage
] = TypeAdapter(Message)
