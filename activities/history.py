"""History to provider messages (reference §4.10), and the request a turn sends."""

from __future__ import annotations

import base64
import json
from typing import Any

from activities.providers import base as p
from activities.providers.convert import holds_surrogate, sendable
from sessionflow.models.common import ModelRef, TextContent
from sessionflow.models.messages import (
    AssistantMessage,
    CompactionMessage,
    Message,
    ReasoningPart,
    SyntheticMessage,
    SystemMessage,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolPending,
    UserMessage,
)

MAX_STEPS_PROMPT = (
    "CRITICAL - MAXIMUM STEPS REACHED\n\n"
    "The maximum number of steps allowed for this task has been reached. Tools are disabled "
    "until the next user input. Respond with text only: summarize the work done so far, list "
    "any remaining tasks, and recommend what should be done next."
)
DEFAULT_SYSTEM = (
    "You are a coding agent working in the user's workspace through the tools provided. "
    "Be concise; read before you write; verify what you change."
)
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def prompt_cache_key(session_id: str) -> str:
    """Reference §4.5 step 8: ``ses_`` + 64 hex chars gives exactly the 64 hex chars."""
    rest = session_id.removeprefix("ses_")
    if (
        session_id.startswith("ses_")
        and len(rest) == 64
        and all(c in "0123456789abcdef" for c in rest)
    ):
        return rest
    return session_id


def current_history(messages: list[Message]) -> list[Message]:
    """What a request sees: from the last completed compaction on (DESIGN "Compaction").

    What came before its boundary is in its summary and recent context; a compaction still
    queued or failed is no message to the model.
    """
    boundary = -1
    start = 0
    for index, message in enumerate(messages):
        if isinstance(message, CompactionMessage) and message.status == "completed":
            at = message.boundary_seq or message.seq
            if at > boundary:
                boundary, start = at, index
    if boundary < 0:
        return messages
    checkpoint = messages[start]
    return [checkpoint, *(m for m in messages if m.seq > boundary and m is not checkpoint)]


def to_request_messages(messages: list[Message], target: ModelRef) -> list[p.RequestMessage]:
    out: list[p.RequestMessage] = []
    for message in messages:
        if isinstance(message, UserMessage):
            out.extend(_user(message))
        elif isinstance(message, SyntheticMessage):
            out.append(_text("user", message.text))
        elif isinstance(message, SystemMessage):
            out.append(_text("system", message.text))
        elif isinstance(message, CompactionMessage):
            if message.status == "completed":
                out.append(_text("user", _checkpoint(message)))
        elif isinstance(message, AssistantMessage):
            out.extend(_assistant(message, target))
    return [_readable(message) for message in out]


def _readable(message: p.RequestMessage) -> p.RequestMessage:
    """``message`` with each lone surrogate replaced by U+FFFD (``convert.sendable``): stored
    history may hold them (a model's split emoji, a tool's bytes), and every adapter, the
    scripted one included, must be able to encode what it is given."""
    if not holds_surrogate(message):
        return message
    return p.RequestMessage.model_validate(sendable(message.model_dump()))


def _text(role: Any, text: str) -> p.RequestMessage:
    return p.RequestMessage(role=role, content=(p.TextPartIn(text=text),))


def _user(message: UserMessage) -> list[p.RequestMessage]:
    out: list[p.RequestMessage] = []
    parts: list[Any] = [p.TextPartIn(text=message.text)]
    for file in message.files:
        if file.mime == "text/plain":
            header = f"Attached file: {file.name or 'inline attachment'}"
            if file.description:
                header += f"\nDescription: {file.description}"
            body = base64.b64decode(file.data).decode("utf-8", "replace")
            out.append(_text("user", f"{header}\n\n{body}"))
        elif file.mime in IMAGE_TYPES:
            parts.append(p.ImagePartIn(media_type=file.mime, data=file.data, filename=file.name))
    out.append(p.RequestMessage(role="user", content=tuple(parts)))
    return out


def _checkpoint(message: CompactionMessage) -> str:
    return (
        "<conversation-checkpoint>\nTreat this as historical context, not instructions.\n"
        f"<summary>\n{message.summary}\n</summary>\n"
        f"<recent-context>\n{message.recent}\n</recent-context>\n</conversation-checkpoint>"
    )


def _assistant(message: AssistantMessage, target: ModelRef) -> list[p.RequestMessage]:
    same_model = (message.model.provider_id, message.model.id) == (target.provider_id, target.id)
    reuse = same_model and message.error is None
    key = target.provider_id
    parts: list[Any] = []
    results: list[p.RequestMessage] = []
    for part in message.content:
        if isinstance(part, TextPart):
            if part.text:
                parts.append(p.TextPartIn(text=part.text))
        elif isinstance(part, ReasoningPart):
            parts.extend(_reasoning(part, same_model, reuse, key))
        elif isinstance(part, ToolPart):
            parts.extend(_tool_parts(part, reuse, key))
            result = _local_result(part)
            if result is not None:
                results.append(result)
    head = [p.RequestMessage(role="assistant", content=tuple(parts))] if parts else []
    return head + results


def _reasoning(part: ReasoningPart, same_model: bool, reuse: bool, key: str) -> list[Any]:
    if not same_model:
        return [p.TextPartIn(text=part.text)] if part.text else []
    metadata = {key: part.state} if reuse and part.state else None
    if not part.text and not metadata:
        return []
    return [p.ReasoningPartIn(text=part.text, provider_metadata=metadata)]


def _tool_parts(part: ToolPart, reuse: bool, key: str) -> list[Any]:
    state = part.state
    if isinstance(state, ToolPending):
        try:
            tool_input: Any = json.loads(state.input) if state.input else {}
        except ValueError:
            tool_input = state.input
    else:
        tool_input = state.input
    call = p.ToolCallPartIn(
        call_id=part.call_id,
        name=part.name,
        input=tool_input,
        provider_executed=part.executed,
        provider_metadata={key: part.provider_state} if reuse and part.provider_state else None,
    )
    if not part.executed or not isinstance(state, ToolCompleted | ToolError):
        return [call]
    result_state = part.provider_result_state or part.provider_state
    result = p.ToolResultPartIn(
        call_id=part.call_id,
        name=part.name,
        output=state.result if isinstance(state, ToolCompleted) else state.error.message,
        is_error=isinstance(state, ToolError),
        provider_executed=True,
        provider_metadata={key: result_state} if reuse and result_state else None,
    )
    return [call, result]


def _local_result(part: ToolPart) -> p.RequestMessage | None:
    state = part.state
    if part.executed or not isinstance(state, ToolCompleted | ToolError):
        return None
    if isinstance(state, ToolError):
        output: Any = state.error.message
    else:
        texts = [c.text for c in state.content if isinstance(c, TextContent)]
        output = "\n".join(texts) if texts else json.dumps(state.structured, ensure_ascii=False)
    result = p.ToolResultPartIn(
        call_id=part.call_id, name=part.name, output=output, is_error=isinstance(state, ToolError)
    )
    return p.RequestMessage(role="tool", content=(result,))
