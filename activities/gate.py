"""The permission gate of one tool call, inside ``run_tool`` before anything runs.

``check`` evaluates the policy (``permissions.py``) over the agent's rules, the session's and
the ones ``always`` answers added: ``deny`` settles the call with "Permission blocked: ..." (the
model reads it and goes on, reference #60); ``ask`` (and every ``question``) records
``session.permission.asked`` and returns "needs approval" without running anything -- the
workflow waits for the answer, holding no activity slot, and runs the call again carrying it.

``replied`` records the answer (``session.permission.replied``, with the rules an ``always``
adds); a rejection with a message settles the call with it (#62). While a call waits, the
claim is held until its ``approval_timeout`` (or ``HOLD_MS``): nothing renews a lease while a
person thinks, and the workflow keeps its busy period meanwhile. The answer of the last
waiting call hands the claim back to its ordinary lease.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from activities.permissions import Verdict, evaluate
from sessionflow.agents import UnknownAgentError
from sessionflow.models import events as ev
from sessionflow.models.common import SessionError
from sessionflow.models.drain import ToolOutcome
from sessionflow.models.messages import ToolPart, ToolRunning
from sessionflow.models.permissions import PermissionReply, PermissionRequest, Rule
from store.claims import Claim
from store.projector import step_waits
from store.sessions import SessionInfo
from store.tool_runs import ToolAttempt

if TYPE_CHECKING:
    from activities.tool_run import ToolActivities

HOLD_MS = 7 * 24 * 3600 * 1000
REJECTED = "The user rejected this call"


def request_id(assistant_message_id: str, call_id: str) -> str:
    """One request per call: the same id whichever attempt asks."""
    digest = hashlib.sha256(f"{assistant_message_id}/{call_id}".encode()).hexdigest()
    return f"per_{digest[:32]}"


def session_rules(session: SessionInfo, agent_rules: tuple[Rule, ...]) -> list[Rule]:
    """The agent's rules, then the session's, then those of ``always`` answers: in that order,
    so that the later win."""
    own = [Rule.model_validate(r) for r in session.settings.get("permissions", ())]
    always = [Rule.model_validate(r) for r in session.settings.get("always", ())]
    return [*agent_rules, *own, *always]


@dataclass
class Gate:
    tools: ToolActivities
    session: SessionInfo
    claim: Claim
    run: ToolAttempt
    tool: Any
    part: ToolPart

    @property
    def _input(self) -> dict[str, Any]:
        return dict(getattr(self.part.state, "input", {}) or {})

    async def check(self) -> ToolOutcome | None:
        """None: run it. Otherwise the call was blocked, or waits for an answer."""
        try:
            agent = self.tools.rt.agents.get(self.session.agent)
        except UnknownAgentError as error:
            return await self._fail(SessionError(type="tool.execution", message=str(error)))
        rules = session_rules(self.session, agent.permissions)
        verdict = evaluate(
            self.tool.name, self._input, rules, self.tool.permission, self.session.directory
        )
        if verdict.action == "deny":
            what = f"{self.tool.name} {verdict.denied}".strip()
            message = f"Permission blocked: the {agent.name} agent's rules deny {what}"
            return await self._fail(SessionError(type="tool.execution", message=message))
        if verdict.action == "ask" or self.tool.asks_user:
            return await self._ask(verdict)
        return None

    async def _ask(self, verdict: Verdict) -> ToolOutcome:
        tool_input = self._input
        question = self.tool.asks_user
        timeout = self.session.settings.get("approval_timeout")
        request = PermissionRequest(
            request_id=request_id(self.run.assistant_message_id, self.run.call_id),
            assistant_message_id=self.run.assistant_message_id,
            call_id=self.run.call_id,
            tool=self.tool.name,
            kind="question" if question else "permission",
            patterns=() if question else verdict.patterns,
            summary=verdict.summary,
            question=str(tool_input.get("question", "")) if question else None,
            options=tuple(str(o) for o in tool_input.get("options", ())) if question else (),
            timeout_s=float(timeout) if timeout else None,
        )
        store = self.tools.rt.store
        seconds = request.timeout_s
        hold = int(seconds * 1000) + self.claim.lease_ms if seconds else HOLD_MS
        asked = ev.PermissionAsked(session_id=self.claim.session_id, request=request)

        async def ask(tx: Any) -> None:
            await store.events.publish(asked, id=f"evt_{request.request_id}_asked", tx=tx)
            await store.claims.hold_for(tx, self.claim, hold)

        await store.claims.run_fenced(self.claim, ask, run=self.run)  # again after a conflict
        return ToolOutcome(call_id=self.run.call_id, status="ask", ask=request)

    async def replied(self, reply: PermissionReply) -> ToolOutcome | None:
        """Record the answer; None: run the call."""
        asked = self.part.state.asked if isinstance(self.part.state, ToolRunning) else None
        if asked is not None:  # else an earlier attempt recorded it
            await self._record(reply, asked)
        if reply.decision == "reject":
            error = SessionError(type="tool.execution", message=reply.message or REJECTED)
            return await self._fail(error)
        return None

    async def _record(self, reply: PermissionReply, asked: PermissionRequest) -> None:
        rules: tuple[Rule, ...] = ()
        if reply.decision == "always":
            rules = tuple(Rule(tool=asked.tool, pattern=p, action="allow") for p in asked.patterns)
        event = ev.PermissionReplied(
            session_id=self.claim.session_id,
            request_id=asked.request_id,
            assistant_message_id=asked.assistant_message_id,
            call_id=asked.call_id,
            decision=reply.decision,
            message=reply.message,
            answer=reply.answer,
            by=reply.by,
            reason="timeout" if reply.timed_out else "answered",
            rules=rules,
        )
        store = self.tools.rt.store

        async def record(tx: Any) -> None:
            await store.events.publish(event, id=f"evt_{asked.request_id}_replied", tx=tx)
            if not await step_waits(tx, self.claim.session_id, asked.assistant_message_id):
                await store.claims.lease_again(tx, self.claim)

        await store.claims.run_fenced(self.claim, record, run=self.run)  # again after a conflict

    async def _fail(self, error: SessionError) -> ToolOutcome:
        return await self.tools._settle(self.claim, self.run, error=error)
