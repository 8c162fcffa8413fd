"""Closing a step whose turn was lost: a killed worker, a deploy, a timeout, a dead execution.

What the attempt streamed is durable up to its last flush, but the ``*.ended`` events that
carry a fragment's text were never written: the text exists only as deltas, which projections
ignore. Closing replays those deltas into the ``*.ended`` events the publisher would have
written (partial text kept, as for an interrupt, reference §4.11), fails the calls that never
ran as stale (§4.8), and ends the step with one ``step.failed``. The restart message that lets
the model continue is the recovered execution's (§5.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from activities.children import closing_of_task
from sessionflow.models import events as ev
from sessionflow.models.common import SessionError
from sessionflow.models.messages import AssistantMessage, ToolPart
from store import Store
from store.db import Tx

RESTART_TEXT = (
    "The server restarted while you were working. "
    "Continue from where you left off without repeating completed work."
)
BUDGET_MESSAGE = "Execution was interrupted repeatedly and will not be resumed automatically."
LOST_STEP = SessionError(type="aborted", message="Step interrupted: its execution was lost")
# A step a run that lost the claim left open (a Reset's old run), ended by the new owner's turn.
ORPHANED_STEP = SessionError(
    type="aborted", message="Step interrupted: another run of the session took it over"
)


def restart_message(session_id: str) -> ev.Synthetic:
    return ev.Synthetic(
        session_id=session_id, text=RESTART_TEXT, description="Continuing after restart"
    )


def stale(message: AssistantMessage, part: ToolPart) -> ev.ToolFailed:
    error = SessionError(type="tool.stale", message=f"Tool execution interrupted: {part.name}")
    return ev.ToolFailed(
        session_id=message.session_id,
        assistant_message_id=message.id,
        call_id=part.call_id,
        error=error,
        executed=part.executed,
    )


@dataclass
class _Open:
    """Fragments a stream started and never ended, with the deltas that are durable."""

    texts: dict[int, list[str]] = field(default_factory=dict)
    reasoning: dict[int, tuple[list[str], dict[str, Any] | None]] = field(default_factory=dict)
    inputs: dict[str, list[str]] = field(default_factory=dict)

    def apply(self, event: Any) -> None:
        if isinstance(event, ev.TextStarted):
            self.texts[event.ordinal] = []
        elif isinstance(event, ev.TextDelta) and event.ordinal in self.texts:
            self.texts[event.ordinal].append(event.delta)
        elif isinstance(event, ev.TextEnded):
            self.texts.pop(event.ordinal, None)
        elif isinstance(event, ev.ReasoningStarted):
            self.reasoning[event.ordinal] = ([], event.state)
        elif isinstance(event, ev.ReasoningDelta) and event.ordinal in self.reasoning:
            self.reasoning[event.ordinal][0].append(event.delta)
        elif isinstance(event, ev.ReasoningEnded):
            self.reasoning.pop(event.ordinal, None)
        elif isinstance(event, ev.ToolInputStarted):
            self.inputs[event.call_id] = []
        elif isinstance(event, ev.ToolInputDelta) and event.call_id in self.inputs:
            self.inputs[event.call_id].append(event.delta)
        elif isinstance(event, ev.ToolInputEnded | ev.ToolCalled):
            self.inputs.pop(event.call_id, None)

    def ended(self, message: AssistantMessage) -> list[ev.Event]:
        ids: dict[str, Any] = {
            "session_id": message.session_id,
            "assistant_message_id": message.id,
        }
        events: list[ev.Event] = [
            ev.TextEnded(**ids, ordinal=ordinal, text="".join(deltas))
            for ordinal, deltas in self.texts.items()
        ]
        events += [
            ev.ReasoningEnded(**ids, ordinal=ordinal, text="".join(deltas), state=state)
            for ordinal, (deltas, state) in self.reasoning.items()
        ]
        events += [
            ev.ToolInputEnded(**ids, call_id=call_id, text="".join(deltas))
            for call_id, deltas in self.inputs.items()
        ]
        return events


async def open_fragments(store: Store, message: AssistantMessage, tx: Tx) -> list[ev.Event]:
    """The ``*.ended`` events that close what the message's last attempt left open, read in
    the fenced transaction that will write them."""
    found = _Open()
    after = message.seq - 1
    while True:
        page = await store.events.read_after(message.session_id, after, tx=tx)
        for stored in page.events:
            if getattr(stored.data, "assistant_message_id", None) == message.id:
                found.apply(stored.data)
        if page.cursor == after:
            return found.ended(message)
        after = page.cursor


async def closing_events(
    store: Store, message: AssistantMessage, error: SessionError, tx: Tx
) -> list[ev.Event]:
    """Everything that ends a lost step, in the order the publisher would have written it."""
    events = await open_fragments(store, message, tx)
    for part in message.content:
        if isinstance(part, ToolPart) and not part.settled:
            events.append(await closing_of_task(store, message, part, tx) or stale(message, part))
    events.append(
        ev.StepFailed(session_id=message.session_id, assistant_message_id=message.id, error=error)
    )
    return events
