"""The typed catalogue of durable session events (reference §8.1).

One model per event type, tagged by a ``Literal`` ``type``; the stored type name carries the
version (``session.step.started.1``). Every event carries ``session_id``, the aggregate field.
Deltas (text, reasoning, tool input) are stored too, so a reconnecting watcher replays tokens,
but projections ignore them.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter

from sessionflow.models.common import (
    ContentPart,
    Delivery,
    Model,
    ModelRef,
    Prompt,
    SessionError,
    Tokens,
)
from sessionflow.models.journal import FileChange, FileState
from sessionflow.models.messages import AssistantPart, Message
from sessionflow.models.permissions import Decision, PermissionRequest, Rule
from sessionflow.models.spend import Budget


class Event(Model):
    """Base of every durable event: ``version`` is part of the stored type name, and
    ``aggregate_field`` names the field whose value is the aggregate (the log) it belongs to."""

    version: ClassVar[int] = 1
    aggregate_field: ClassVar[str] = "session_id"

    type: str

    @classmethod
    def event_type(cls) -> str:
        default = cls.model_fields["type"].default
        assert isinstance(default, str), f"{cls.__name__} needs a literal type default"
        return default

    @classmethod
    def stored_type(cls) -> str:
        return _stored_type(cls)

    @property
    def aggregate_id(self) -> str:
        value = getattr(self, self.aggregate_field)
        assert isinstance(value, str)
        return value


@functools.cache
def _stored_type(cls: type[Event]) -> str:
    return f"{cls.event_type()}.{cls.version}"


class SessionEventBase(Event):
    """Base of the session catalogue: the aggregate is the session."""

    session_id: str


# --- session lifecycle --------------------------------------------------------------------------


class SessionCreated(SessionEventBase):
    type: Literal["session.created"] = "session.created"
    directory: str
    title: str = ""
    model: ModelRef | None = None
    agent: str | None = None
    workspace_id: str | None = None
    parent_id: str | None = None
    settings: dict[str, Any] | None = None
    # The host whose workers run its tools (None: ``local``), and the instruction files its
    # workspace held when that host checked it (file name -> text).
    host: str | None = None
    observed: dict[str, str] | None = None
    # A fork's provider requests so far: its source's (a scripted model goes on from there).
    requests: int = 0


class SessionMoved(SessionEventBase):
    """The session's tools run on another host (or in another workspace) from now on;
    recorded between busy periods only. The context baseline is rebuilt at the next turn."""

    type: Literal["session.moved"] = "session.moved"
    host: str
    directory: str
    previous_host: str
    previous_directory: str
    observed: dict[str, str] | None = None


class WorkspaceObserved(SessionEventBase):
    """The instruction files of the workspace as its host last read them, for turns that run
    on workers of other hosts (file name -> text)."""

    type: Literal["session.workspace.observed"] = "session.workspace.observed"
    instructions: dict[str, str] = Field(default_factory=dict)


class SessionRenamed(SessionEventBase):
    type: Literal["session.renamed"] = "session.renamed"
    title: str


class BudgetSet(SessionEventBase):
    """The session's spending limits from now on (``None``: no limits)."""

    type: Literal["session.budget.set"] = "session.budget.set"
    budget: Budget | None = None


class ModelSelected(SessionEventBase):
    type: Literal["session.model.selected"] = "session.model.selected"
    model: ModelRef


class AgentSelected(SessionEventBase):
    type: Literal["session.agent.selected"] = "session.agent.selected"
    agent: str


# --- inputs -------------------------------------------------------------------------------------


class PromptAdmitted(SessionEventBase):
    type: Literal["session.prompt.admitted"] = "session.prompt.admitted"
    input_id: str
    prompt: Prompt
    delivery: Delivery


class PromptPromoted(SessionEventBase):
    type: Literal["session.prompt.promoted"] = "session.prompt.promoted"
    input_id: str


class CompactionAdmitted(SessionEventBase):
    type: Literal["session.compaction.admitted"] = "session.compaction.admitted"
    input_id: str


class CompactionStarted(SessionEventBase):
    type: Literal["session.compaction.started"] = "session.compaction.started"
    input_id: str | None = None
    # An automatic compaction has no input: the workflow names it (and its message).
    compaction_id: str | None = None


class CompactionDelta(SessionEventBase):
    """Summary text as it streams (ephemeral, like text deltas: projections ignore it)."""

    type: Literal["session.compaction.delta"] = "session.compaction.delta"
    compaction_id: str
    delta: str


class CompactionEnded(SessionEventBase):
    type: Literal["session.compaction.ended"] = "session.compaction.ended"
    input_id: str | None = None
    compaction_id: str | None = None
    reason: Literal["auto", "manual"] = "manual"
    summary: str
    recent: str = ""
    # The newest message the summary and recent context cover: later ones follow them.
    through_seq: int | None = None


class CompactionFailed(SessionEventBase):
    type: Literal["session.compaction.failed"] = "session.compaction.failed"
    input_id: str | None = None
    compaction_id: str | None = None
    error: SessionError


class ContextSet(SessionEventBase):
    """A context entry set through the API (rendered into the system context)."""

    type: Literal["session.context.set"] = "session.context.set"
    key: str
    text: str


class ContextDeleted(SessionEventBase):
    type: Literal["session.context.deleted"] = "session.context.deleted"
    key: str


class ContextBaselined(SessionEventBase):
    """The session's system context as frozen (``baseline``) and its sources as last seen."""

    type: Literal["session.context.baselined"] = "session.context.baselined"
    baseline: str
    snapshot: dict[str, str]


class Synthetic(SessionEventBase):
    type: Literal["session.synthetic"] = "session.synthetic"
    text: str
    description: str | None = None
    metadata: dict[str, Any] | None = None


class InstructionsUpdated(SessionEventBase):
    type: Literal["session.instructions.updated"] = "session.instructions.updated"
    text: str


class Todo(Model):
    """One item of a session's todo list (``todowrite``)."""

    content: str = Field(min_length=1, max_length=2000)
    status: Literal["pending", "in_progress", "completed", "cancelled"] = "pending"
    priority: Literal["high", "medium", "low"] = "medium"
    id: str = Field(default="", max_length=128)


class TodoUpdated(SessionEventBase):
    """The session's whole todo list, as a ``todowrite`` call replaced it."""

    type: Literal["session.todo.updated"] = "session.todo.updated"
    todos: tuple[Todo, ...]
    assistant_message_id: str | None = None
    call_id: str | None = None


# --- executions (busy periods) ------------------------------------------------------------------


class ExecutionStarted(SessionEventBase):
    type: Literal["session.execution.started"] = "session.execution.started"
    execution_id: str


class ExecutionSucceeded(SessionEventBase):
    type: Literal["session.execution.succeeded"] = "session.execution.succeeded"
    execution_id: str


class ExecutionFailed(SessionEventBase):
    type: Literal["session.execution.failed"] = "session.execution.failed"
    execution_id: str
    error: SessionError


class ExecutionInterrupted(SessionEventBase):
    type: Literal["session.execution.interrupted"] = "session.execution.interrupted"
    execution_id: str
    reason: str = "user"


# --- steps --------------------------------------------------------------------------------------


class StepStarted(SessionEventBase):
    type: Literal["session.step.started"] = "session.step.started"
    assistant_message_id: str
    agent: str
    model: ModelRef
    attempt: int = 1


class StepEnded(SessionEventBase):
    type: Literal["session.step.ended"] = "session.step.ended"
    assistant_message_id: str
    finish: str
    cost: float | None = Field(None, description="USD; null when the model has no price")
    tokens: Tokens = Tokens()
    files: tuple[str, ...] = ()


class StepFailed(SessionEventBase):
    type: Literal["session.step.failed"] = "session.step.failed"
    assistant_message_id: str
    error: SessionError
    cost: float | None = None
    tokens: Tokens | None = None


class RetryScheduled(SessionEventBase):
    type: Literal["session.retry.scheduled"] = "session.retry.scheduled"
    assistant_message_id: str
    attempt: int
    at: int = Field(description="epoch ms when the next attempt starts")
    error: SessionError


# --- text and reasoning -------------------------------------------------------------------------


class TextStarted(SessionEventBase):
    type: Literal["session.text.started"] = "session.text.started"
    assistant_message_id: str
    ordinal: int


class TextDelta(SessionEventBase):
    type: Literal["session.text.delta"] = "session.text.delta"
    assistant_message_id: str
    ordinal: int
    delta: str


class TextEnded(SessionEventBase):
    type: Literal["session.text.ended"] = "session.text.ended"
    assistant_message_id: str
    ordinal: int
    text: str


class ReasoningStarted(SessionEventBase):
    type: Literal["session.reasoning.started"] = "session.reasoning.started"
    assistant_message_id: str
    ordinal: int
    state: dict[str, Any] | None = None


class ReasoningDelta(SessionEventBase):
    type: Literal["session.reasoning.delta"] = "session.reasoning.delta"
    assistant_message_id: str
    ordinal: int
    delta: str


class ReasoningEnded(SessionEventBase):
    type: Literal["session.reasoning.ended"] = "session.reasoning.ended"
    assistant_message_id: str
    ordinal: int
    text: str
    state: dict[str, Any] | None = None


# --- tools --------------------------------------------------------------------------------------


class ToolInputStarted(SessionEventBase):
    type: Literal["session.tool.input.started"] = "session.tool.input.started"
    assistant_message_id: str
    call_id: str
    name: str


class ToolInputDelta(SessionEventBase):
    type: Literal["session.tool.input.delta"] = "session.tool.input.delta"
    assistant_message_id: str
    call_id: str
    delta: str


class ToolInputEnded(SessionEventBase):
    type: Literal["session.tool.input.ended"] = "session.tool.input.ended"
    assistant_message_id: str
    call_id: str
    text: str


class ToolCalled(SessionEventBase):
    type: Literal["session.tool.called"] = "session.tool.called"
    assistant_message_id: str
    call_id: str
    name: str
    input: dict[str, Any]
    executed: bool = False
    state: dict[str, Any] | None = None


class ToolProgress(SessionEventBase):
    type: Literal["session.tool.progress"] = "session.tool.progress"
    assistant_message_id: str
    call_id: str
    structured: dict[str, Any] = Field(default_factory=dict)
    content: tuple[ContentPart, ...] = ()
    host: str | None = None  # the host whose worker ran the tool


class ToolSucceeded(SessionEventBase):
    type: Literal["session.tool.success"] = "session.tool.success"
    assistant_message_id: str
    call_id: str
    structured: dict[str, Any] = Field(default_factory=dict)
    content: tuple[ContentPart, ...] = ()
    output_paths: tuple[str, ...] = ()
    result: Any = None
    executed: bool = False
    result_state: dict[str, Any] | None = None
    # The whole output when ``content`` was cut for the model (kept here, never in a payload).
    output: str | None = None
    host: str | None = None  # the host whose worker ran the tool (None: not a local run)


class ToolFailed(SessionEventBase):
    type: Literal["session.tool.failed"] = "session.tool.failed"
    assistant_message_id: str
    call_id: str
    error: SessionError
    result: Any = None
    executed: bool = False
    result_state: dict[str, Any] | None = None
    host: str | None = None  # the host whose worker ran (or could not run) the tool


# --- the file-change journal and rewind (``sessionflow/models/journal.py``) ----------------------


class FilesChanged(SessionEventBase):
    """What a tool call changed in the workspace, path by path, written with its settlement."""

    type: Literal["session.files.changed"] = "session.files.changed"
    assistant_message_id: str
    call_id: str
    changes: tuple[FileChange, ...]


class RevertedPath(Model):
    """A path a revert (or unrevert) gave back ``to`` (None: deleted) from ``was``."""

    path: str
    was: FileState | None = None
    to: FileState | None = None


class SessionReverted(SessionEventBase):
    """The workspace was restored to its state at ``message_id`` (its seq ``boundary_seq``):
    the messages after it are hidden from history until an unrevert, or dropped for good
    (``session.revert.committed``) once a new prompt is promoted. Written after the files."""

    type: Literal["session.reverted"] = "session.reverted"
    message_id: str
    boundary_seq: int
    paths: tuple[RevertedPath, ...] = ()
    forced: tuple[str, ...] = ()


class SessionUnreverted(SessionEventBase):
    """The last revert undone: its paths hold again what they held before it, and the
    hidden messages are shown again."""

    type: Literal["session.unreverted"] = "session.unreverted"
    message_id: str
    paths: tuple[RevertedPath, ...] = ()
    forced: tuple[str, ...] = ()


class RevertCommitted(SessionEventBase):
    """A prompt came after a revert: the messages it hid are dropped from history (still in
    the log), and the revert can no longer be undone."""

    type: Literal["session.revert.committed"] = "session.revert.committed"
    message_id: str
    boundary_seq: int


class MessageCopied(SessionEventBase):
    """A fork's copy of one message of the session it came from (``from_message_id`` there),
    under a new id, at this event's seq: a fork's log replays its history by itself."""

    type: Literal["session.message.copied"] = "session.message.copied"
    message: Message
    from_message_id: str


class PartCopied(SessionEventBase):
    """One part of a fork's copied assistant message too large to copy whole in one event
    (``session.message.copied`` then carries it without its parts), appended in order."""

    type: Literal["session.part.copied"] = "session.part.copied"
    assistant_message_id: str
    part: AssistantPart


class SessionForked(SessionEventBase):
    """A new session (``fork_session_id``, in ``directory``) was made from this one's history
    up to ``message_id`` and its workspace as it was then (``paths``: what the copy restored).
    Written last, after the fork's own log, in the same transaction."""

    type: Literal["session.forked"] = "session.forked"
    message_id: str
    fork_session_id: str
    directory: str
    paths: tuple[RevertedPath, ...] = ()
    left_out: tuple[str, ...] = ()  # protected paths and special files, not copied


# --- permissions and questions ------------------------------------------------------------------


class PermissionAsked(SessionEventBase):
    type: Literal["session.permission.asked"] = "session.permission.asked"
    request: PermissionRequest


class PermissionReplied(SessionEventBase):
    type: Literal["session.permission.replied"] = "session.permission.replied"
    request_id: str
    assistant_message_id: str
    call_id: str
    decision: Decision
    message: str | None = None
    answer: str | None = None
    by: str | None = None
    # answered (a person), timeout (``approval_timeout``), interrupted (the step stopped).
    reason: Literal["answered", "timeout", "interrupted"] = "answered"
    # The allow rules an ``always`` added to the session.
    rules: tuple[Rule, ...] = ()


SessionEvent = Annotated[
    SessionCreated
    | SessionMoved
    | WorkspaceObserved
    | SessionRenamed
    | BudgetSet
    | ModelSelected
    | AgentSelected
    | PromptAdmitted
    | PromptPromoted
    | CompactionAdmitted
    | CompactionStarted
    | CompactionDelta
    | CompactionEnded
    | CompactionFailed
    | ContextSet
    | ContextDeleted
    | ContextBaselined
    | Synthetic
    | InstructionsUpdated
    | TodoUpdated
    | ExecutionStarted
    | ExecutionSucceeded
    | ExecutionFailed
    | ExecutionInterrupted
    | StepStarted
    | StepEnded
    | StepFailed
    | RetryScheduled
    | TextStarted
    | TextDelta
    | TextEnded
    | ReasoningStarted
    | ReasoningDelta
    | ReasoningEnded
    | ToolInputStarted
    | ToolInputDelta
    | ToolInputEnded
    | ToolCalled
    | ToolProgress
    | ToolSucceeded
    | ToolFailed
    | PermissionAsked
    | PermissionReplied
    | FilesChanged
    | SessionReverted
    | SessionUnreverted
    | RevertCommitted
    | MessageCopied
    | PartCopied
    | SessionForked,
    Field(discriminator="type"),
]

SESSION_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(SessionEvent)

DELTA_TYPES: frozenset[str] = frozenset(
    {
        TextDelta.event_type(),
        ReasoningDelta.event_type(),
        ToolInputDelta.event_type(),
        CompactionDelta.event_type(),
    }
)
