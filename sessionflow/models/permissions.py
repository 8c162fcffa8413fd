"""Permissions and questions: rules, the requests a call waits on, and the replies.

A rule maps a tool and a pattern to an action; the last matching rule wins
(``activities/permissions.py``). A request is what a call waits on: a permission to run it
(``kind="permission"``) or a question the model asked the user (``kind="question"``). A reply
answers one: ``once`` runs the call, ``always`` runs it and adds the request's patterns to the
session as ``allow`` rules, ``reject`` refuses it (with a message: the model reads it and goes
on; without one: the step is interrupted).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sessionflow.models.common import Model

Action = Literal["allow", "ask", "deny"]
Decision = Literal["once", "always", "reject"]
RequestKind = Literal["permission", "question"]


class Rule(Model):
    """``tool`` and ``pattern`` are wildcards (``*`` any text); ``pattern`` is matched against
    a bash command, or a file tool's workspace-relative path."""

    tool: str = "*"
    pattern: str = "*"
    action: Action


class PermissionRequest(Model):
    """What a call waits on: small, it travels in payloads."""

    request_id: str
    assistant_message_id: str
    call_id: str
    tool: str
    kind: RequestKind = "permission"
    # The patterns an ``always`` adds as allow rules.
    patterns: tuple[str, ...] = ()
    summary: str = ""
    question: str | None = None
    options: tuple[str, ...] = ()
    # An unanswered request becomes a rejection after this long (session ``approval_timeout``).
    timeout_s: float | None = None


class PermissionReply(Model):
    request_id: str
    decision: Decision
    message: str | None = Field(default=None, max_length=4000)
    # A question's answer (the question tool's result).
    answer: str | None = Field(default=None, max_length=20000)
    by: str | None = Field(default=None, max_length=200)
    # Set by the workflow when ``approval_timeout`` ran out before anyone answered.
    timed_out: bool = False

    @property
    def declined(self) -> bool:
        """A rejection without a correction: the step stops (reference #61, #65)."""
        return self.decision == "reject" and not self.message


class RespondResult(Model):
    """What ``respond`` did: ``answered`` (the workflow took it) or ``sent`` (no worker
    answered in time: recorded as a signal, taken when a worker is back)."""

    status: Literal["answered", "sent"]
    request_id: str
