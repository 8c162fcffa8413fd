"""Request bodies: the SDK's keyword arguments, built from the models in ``sessionflow/models``.

Responses need no models of their own: routes return what ``SessionClient`` returns
(``SessionInfo``, ``InputReceipt``, ``Message``, ``SessionStatus``, ``Outcome``...).
"""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionflow.models.common import CompactionSettings, Delivery, ModelRef, Prompt
from sessionflow.models.drain import Outcome
from sessionflow.models.permissions import Decision, Rule
from sessionflow.models.spend import Budget


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionSettings(Body):
    max_active_tools: int = Field(default=8, ge=1, description="tools one session runs at once")
    max_steps: int | None = Field(
        default=None,
        ge=1,
        description="model turns per prompt (a steer joins the prompt it steers)",
    )
    system: str | None = Field(default=None, description="extra system prompt")
    compaction: CompactionSettings | None = None
    permissions: list[Rule] = Field(default=[], description="rules; the last match wins")
    network: bool = Field(default=False, description="let bash reach the network")
    mcp: dict[str, bool] | None = Field(
        default=None, description="turn the workers' configured MCP servers on or off by name"
    )
    approval_timeout: float | None = Field(
        default=None, gt=0, description="seconds an unanswered permission ask waits, then fails"
    )


class CreateSession(Body):
    workspace: str = Field(description="absolute path of the directory the tools work in")
    model: str = Field(description="<provider>/<model>, e.g. scripted/demo.json")
    title: str = ""
    session_id: str | None = Field(default=None, description="choose the id (idempotency)")
    agent: str | None = Field(default=None, description="the agent (default: the default one)")
    host: str | None = Field(
        default=None,
        description="the host whose workers run its tools, where the workspace is "
        "(default: the server's SESSIONFLOW_HOST, else local)",
    )
    settings: SessionSettings = SessionSettings()
    budget: Budget | None = Field(
        default=None, description="pause at the first step boundary where a limit is reached"
    )

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not posixpath.isabs(value):
            raise ValueError("the workspace must be an absolute path on the workers' hosts")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        ModelRef.parse(value)
        return value


class RevertSession(Body):
    message_id: str = Field(description="the last message to keep")
    dry_run: bool = Field(default=False, description="say what would change; change nothing")
    force: list[str] = Field(
        default_factory=list,
        description="paths to restore (or leave as they are) although they changed since",
    )


class ForkSession(Body):
    message_id: str = Field(description="the last message the fork keeps")
    workspace: str = Field(description="a new directory for the fork, on the session's host")
    dry_run: bool = Field(default=False, description="say what would be copied; do nothing")
    force: list[str] = Field(
        default_factory=list,
        description="paths copied as they are now although their content then is unknown",
    )

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not posixpath.isabs(value):
            raise ValueError("the workspace must be an absolute path on the session's host")
        return value


class UnrevertSession(Body):
    force: list[str] = Field(
        default_factory=list, description="paths to put back although they changed since"
    )


class MoveSession(Body):
    host: str = Field(description="the host its tools run on from now")
    workspace: str | None = Field(
        default=None, description="its workspace on that host (default: the same path)"
    )

    @field_validator("workspace")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not posixpath.isabs(value):
            raise ValueError("the workspace must be an absolute path on the new host")
        return value


class PromptRequest(Prompt):
    """A prompt (text, files, metadata) and how to deliver it."""

    delivery: Delivery = "steer"
    input_id: str | None = Field(
        default=None,
        description="idempotency key: the same id and content return the same receipt, "
        "different content under it is refused (409)",
    )
    wake: bool = Field(default=True, description="false: record only; it runs on the next wake")

    def prompt(self) -> Prompt:
        return Prompt(text=self.text, files=self.files, metadata=self.metadata)


class InterruptBody(Body):
    reason: str = Field(default="user", max_length=200)
    request_id: str | None = Field(default=None, description="a repeat is answered once")


class Reply(Body):
    """A reply to a waiting permission ask: ``once`` runs the call, ``always`` also allows such
    calls from now on, ``reject`` refuses it (with a ``message`` the model reads and goes on;
    without one the step stops)."""

    decision: Decision
    message: str | None = Field(default=None, max_length=4000)
    by: str | None = Field(default=None, max_length=200, description="who answered")


class Answer(Body):
    """The answer to a question the model asked (the question tool's result)."""

    text: str = Field(max_length=20000)
    by: str | None = Field(default=None, max_length=200)


class AgentChoice(Body):
    agent: str = Field(description="the agent for the next model turns, e.g. build or plan")


class Compaction(BaseModel):
    """The compaction's input id: a request while one is pending answers with the pending one."""

    input_id: str


class ResumeAnswer(BaseModel):
    """``done``: the busy period ended with ``outcome``; else the wait timed out (202) and the
    work goes on: ask again to join it."""

    done: bool
    outcome: Outcome | None = None
