"""Projections: sessions, messages, parts and inputs, updated inside each event's transaction.

Reference §1.8, §4.6 and §6 (projection-side rules). Deltas are never projected. Messages that
an event creates take the event's seq, and, when the event names no message, an id derived from
the event id.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from pydantic import TypeAdapter

from sessionflow.errors import InvalidDurableEventError, LifecycleConflictError
from sessionflow.models import events as ev
from sessionflow.models.common import Tokens
from sessionflow.models.messages import (
    MESSAGE_ADAPTER,
    AssistantMessage,
    AssistantPart,
    CompactionMessage,
    ReasoningPart,
    RetryInfo,
    SyntheticMessage,
    SystemMessage,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolPending,
    ToolRunning,
    ToolTimes,
    UserMessage,
)
from sessionflow.models.spend import token_total
from store import codec
from store.db import Connection, Tx
from store.dialect import DialectName, insert
from store.events import EventStore, StoredEvent
from store.prepared import Prepared
from store.schema import input_table, message_table, part_table, session_table

E = TypeVar("E", bound=ev.Event)
Handler = Callable[[Tx, StoredEvent, Any], Awaitable[None]]

_HANDLERS: dict[type[ev.Event], Handler] = {}


def handles(*classes: type[ev.Event]) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for cls in classes:
            _HANDLERS[cls] = handler
        return handler

    return register


def install(events: EventStore) -> None:
    """Register every projector of this module on ``events``."""
    for cls, handler in _HANDLERS.items():
        events.project(cls, _bind(handler))


def _bind(handler: Handler) -> Callable[[Tx, StoredEvent], Awaitable[None]]:
    async def project(tx: Tx, stored: StoredEvent) -> None:
        await handler(tx, stored, stored.data)

    return project


def derived_message_id(event_id: str) -> str:
    return "msg_" + event_id.removeprefix("evt_")


# --- sessions -----------------------------------------------------------------------------------


@handles(ev.SessionCreated)
async def _created(tx: Tx, stored: StoredEvent, event: ev.SessionCreated) -> None:
    values = {
        "id": event.session_id,
        "directory": codec.column_text(event.directory),
        "workspace_id": event.workspace_id,
        "parent_id": event.parent_id,
        "title": codec.column_text(event.title),
        "model": codec.dumps(event.model.model_dump(mode="json")) if event.model else None,
        "agent": event.agent,
        "host": event.host,
        "settings": codec.dumps(_observing(event.settings, event.observed)),
        "request_count": event.requests,
        "time_created": stored.created,
        "time_updated": stored.created,
    }
    statement = insert(tx.dialect, session_table).values(**values).on_conflict_do_nothing()
    if not await _inserted(tx, statement.returning(session_table.c.id)):
        raise InvalidDurableEventError(f"Session {event.session_id} already exists")


def _observing(settings: dict[str, Any] | None, observed: dict[str, str] | None) -> dict[str, Any]:
    if observed is None:
        return settings or {}
    return {**(settings or {}), "observed": observed}


@handles(ev.SessionMoved)
async def _moved(tx: Tx, stored: StoredEvent, event: ev.SessionMoved) -> None:
    """A moved session's context baseline is rebuilt from the new workspace at its next turn
    (reference §7.2 #5: the checkpoint goes with the move)."""
    settings = await _settings(tx, event.session_id)
    settings["baseline"] = None  # None, not absent: rebuilt, as after a compaction
    settings.pop("observed", None)
    values = {
        "host": event.host,
        "directory": codec.column_text(event.directory),
        "settings": codec.dumps(_observing(settings, event.observed)),
        "time_updated": stored.created,
    }
    await _update_session(tx, event.session_id, values)


@handles(ev.SessionReverted)
async def _reverted(tx: Tx, stored: StoredEvent, event: ev.SessionReverted) -> None:
    """The messages from ``boundary_seq`` on are hidden (``sessionflow/models/journal.py``)
    until an unrevert or the revert's commit; the context baseline is rebuilt at the next turn
    (the workspace it was read from changed)."""
    settings = await _settings(tx, event.session_id)
    settings["revert"] = {
        "message_id": event.message_id,
        "boundary_seq": event.boundary_seq,
        "seq": stored.seq,
        "previous": settings.get("revert"),  # a revert staged before it, which it hides too
    }
    settings["baseline"] = None
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})


@handles(ev.SessionUnreverted)
async def _unreverted(tx: Tx, stored: StoredEvent, event: ev.SessionUnreverted) -> None:
    settings = await _settings(tx, event.session_id)
    revert = settings.pop("revert", None)
    previous = revert.get("previous") if isinstance(revert, dict) else None
    if previous is not None:
        settings["revert"] = previous  # the revert it undid was staged on top of this one
    settings["baseline"] = None
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})


@handles(ev.RevertCommitted)
async def _revert_committed(tx: Tx, stored: StoredEvent, event: ev.RevertCommitted) -> None:
    """The hidden messages are dropped from the projection (their events stay in the log)."""
    settings = await _settings(tx, event.session_id)
    settings.pop("revert", None)
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})
    await _write_back(tx)
    doomed = sa.select(message_table.c.id).where(
        message_table.c.session_id == event.session_id,
        message_table.c.seq >= event.boundary_seq,
        message_table.c.seq < stored.seq,
    )
    await tx.conn.execute(part_table.delete().where(part_table.c.message_id.in_(doomed)))
    await tx.conn.execute(
        message_table.delete().where(
            message_table.c.session_id == event.session_id,
            message_table.c.seq >= event.boundary_seq,
            message_table.c.seq < stored.seq,
        )
    )
    _messages(tx).clear()


@handles(ev.MessageCopied)
async def _copied(tx: Tx, stored: StoredEvent, event: ev.MessageCopied) -> None:
    """A fork's message, as it was in the session it came from (its time kept), and its
    step's usage in the fork's totals (reference §8.3: a fork recomputes them)."""
    message = event.message
    if message.session_id != event.session_id or message.seq != stored.seq:
        raise InvalidDurableEventError(
            f"A copied message must name its session {event.session_id} and its event's seq "
            f"{stored.seq}, not {message.session_id} at {message.seq}"
        )
    await _insert_message(tx, stored, message.model_copy(deep=True), created=message.time_created)
    if isinstance(message, AssistantMessage) and message.time_completed is not None:
        await _add_usage(tx, stored, message.cost, message.tokens)


@handles(ev.PartCopied)
async def _part_copied(tx: Tx, stored: StoredEvent, event: ev.PartCopied) -> None:
    message = await _assistant(tx, event)
    message.content.append(event.part.model_copy(deep=True))
    _messages(tx)[message.id].changed_parts.add(len(message.content) - 1)


@handles(ev.WorkspaceObserved)
async def _observed(tx: Tx, stored: StoredEvent, event: ev.WorkspaceObserved) -> None:
    settings = _observing(await _settings(tx, event.session_id), event.instructions)
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})


@handles(ev.BudgetSet)
async def _budget(tx: Tx, stored: StoredEvent, event: ev.BudgetSet) -> None:
    """Budgets live in the session's settings: every turn reads them with the session."""
    settings = await _settings(tx, event.session_id)
    if event.budget is None:
        settings.pop("budget", None)
    else:
        settings["budget"] = event.budget.model_dump(mode="json", exclude_none=True)
    values = {"settings": codec.dumps(settings), "time_updated": stored.created}
    await _update_session(tx, event.session_id, values)


@handles(ev.SessionRenamed, ev.ModelSelected, ev.AgentSelected)
async def _session_settings(tx: Tx, stored: StoredEvent, event: ev.SessionEventBase) -> None:
    values: dict[str, Any] = {"time_updated": stored.created}
    if isinstance(event, ev.SessionRenamed):
        values["title"] = codec.column_text(event.title)
    elif isinstance(event, ev.ModelSelected):
        values["model"] = codec.dumps(event.model.model_dump(mode="json"))
    elif isinstance(event, ev.AgentSelected):
        values["agent"] = event.agent
    await _update_session(tx, event.session_id, values)


@handles(ev.ContextSet, ev.ContextDeleted, ev.ContextBaselined)
async def _context(tx: Tx, stored: StoredEvent, event: ev.SessionEventBase) -> None:
    """Context entries and the frozen baseline live in the session's settings: every turn
    reads the session anyway."""
    settings = await _settings(tx, event.session_id)
    if isinstance(event, ev.ContextSet):
        settings.setdefault("context", {})[event.key] = event.text
    elif isinstance(event, ev.ContextDeleted):
        settings.get("context", {}).pop(event.key, None)
    elif isinstance(event, ev.ContextBaselined):
        settings["baseline"] = {"baseline": event.baseline, "snapshot": event.snapshot}
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})


async def _settings(tx: Tx, session_id: str) -> dict[str, Any]:
    query = sa.select(session_table.c.settings).where(session_table.c.id == session_id)
    raw = (await tx.conn.execute(query)).scalar_one_or_none()
    loaded = codec.loads(raw) if raw else {}
    return loaded if isinstance(loaded, dict) else {}


async def _inserted(tx: Tx, statement: Any) -> bool:
    """Whether an INSERT ... ON CONFLICT DO NOTHING RETURNING inserted its row.

    RETURNING, not rowcount: psycopg reports -1 for INSERT unless asked to preserve it.
    """
    return (await tx.conn.execute(statement)).first() is not None


async def _update_session(tx: Tx, session_id: str, values: dict[str, Any]) -> None:
    await tx.conn.execute(
        session_table.update().where(session_table.c.id == session_id).values(**values)
    )


async def _touch(tx: Tx, stored: StoredEvent) -> None:
    await _TOUCH.rows(tx.conn, tx.dialect, {"sid": stored.aggregate_id, "at": stored.created})


_TOUCH = Prepared(
    lambda _dialect: (
        session_table.update()
        .where(session_table.c.id == sa.bindparam("sid"))
        .values(time_updated=sa.bindparam("at"))
    )
)


# --- messages -----------------------------------------------------------------------------------


# A transaction's messages (its unit of work, in ``Tx.cache``): a batch of events touching one
# message reads it once and writes what changed once, just before the commit. An assistant
# message is stored as its own row (the message without its parts) and one row per part
# (``session_part``), so an event that changes one part writes that part alone.
_MESSAGES = "projector.messages"

PART_ADAPTER: TypeAdapter[TextPart | ReasoningPart | ToolPart] = TypeAdapter(AssistantPart)

# A message and its parts in one statement: the message row first (position -1), then its
# parts in order.
MESSAGE_WITH_PARTS = Prepared(
    lambda _dialect: sa.union_all(
        sa.select(sa.literal_column("-1").label("position"), message_table.c.data).where(
            message_table.c.id == sa.bindparam("mid"),
            message_table.c.session_id == sa.bindparam("sid"),
        ),
        sa.select(part_table.c.position, part_table.c.data).where(
            part_table.c.message_id == sa.bindparam("mid"),
            part_table.c.session_id == sa.bindparam("sid"),
        ),
    ).order_by(sa.literal_column("position"))
)
_INSERT_MESSAGE = Prepared(
    lambda dialect: (
        insert(dialect, message_table)
        .values(
            id=sa.bindparam("mid"),
            session_id=sa.bindparam("sid"),
            type=sa.bindparam("kind"),
            seq=sa.bindparam("message_seq"),
            time_created=sa.bindparam("created"),
            time_updated=sa.bindparam("created"),
            data=sa.bindparam("body"),
        )
        .on_conflict_do_nothing()
        .returning(message_table.c.id)
    )
)


def _latest_assistant_query() -> Any:
    return (
        sa.select(message_table.c.id, message_table.c.data)
        .where(message_table.c.session_id == sa.bindparam("sid"))
        .where(message_table.c.type == "assistant")
        .order_by(message_table.c.seq.desc())
        .limit(1)
    )


def _step_opening_query() -> Any:
    latest = _latest_assistant_query().subquery()
    return sa.union_all(
        sa.select(sa.literal_column("0").label("which"), message_table.c.id, message_table.c.data)
        .where(message_table.c.session_id == sa.bindparam("sid"))
        .where(message_table.c.id == sa.bindparam("mid")),
        sa.select(sa.literal_column("1").label("which"), latest.c.id, latest.c.data),
    )


_LATEST_ASSISTANT = Prepared(lambda _dialect: _latest_assistant_query())
# A step's opening, in one statement: the step's own message if it exists (0: a retry), and the
# session's latest assistant message (1), which a new step may supersede.
_STEP_OPENING = Prepared(lambda _dialect: _step_opening_query())
_WRITE_BACK = Prepared(
    lambda _dialect: (
        message_table.update()
        .where(message_table.c.id == sa.bindparam("mid"))
        .values(time_updated=sa.bindparam("updated"), data=sa.bindparam("body"))
    )
)


def _write_part_statement(dialect: DialectName) -> Any:
    statement = insert(dialect, part_table).values(
        message_id=sa.bindparam("mid"),
        position=sa.bindparam("position"),
        session_id=sa.bindparam("sid"),
        call_id=sa.bindparam("call_id"),
        data=sa.bindparam("body"),
    )
    return statement.on_conflict_do_update(
        index_elements=[part_table.c.message_id, part_table.c.position],
        set_={"call_id": statement.excluded.call_id, "data": statement.excluded.data},
    )


_WRITE_PART = Prepared(_write_part_statement)


@dataclass
class _Loaded:
    message: Any
    updated: int | None = None  # time_updated to write with the message row, once it changed
    changed_parts: set[int] = field(default_factory=set)  # positions in an assistant's content


def _messages(tx: Tx) -> dict[str, _Loaded]:
    loaded: dict[str, _Loaded] | None = tx.cache.get(_MESSAGES)
    if loaded is None:
        loaded = tx.cache[_MESSAGES] = {}
        tx.before_commit.append(_write_back)
    return loaded


async def _write_back(tx: Tx) -> None:
    """Write what changed of every message of ``tx`` (they stay cached, now unchanged)."""
    for entry in _messages(tx).values():
        message = entry.message
        if entry.updated is not None:
            params = {"mid": message.id, "updated": entry.updated, "body": message_row(message)}
            await _WRITE_BACK.rows(tx.conn, tx.dialect, params)
            entry.updated = None
        if entry.changed_parts:
            parts = [_part_row(message, position) for position in sorted(entry.changed_parts)]
            await _WRITE_PART.many(tx.conn, tx.dialect, parts)
            entry.changed_parts.clear()


def message_row(message: Any) -> str:
    """A message as its own row stores it: an assistant message without its parts."""
    if isinstance(message, AssistantMessage):
        return codec.dump_model(message, exclude={"content"})
    return codec.dump_model(message)


def _part_row(message: AssistantMessage, position: int) -> dict[str, Any]:
    part = message.content[position]
    return {
        "mid": message.id,
        "position": position,
        "sid": message.session_id,
        "call_id": part.call_id if isinstance(part, ToolPart) else None,
        "body": codec.dump_model(part),
    }


def assemble(rows: Sequence[Any]) -> Any:
    """A message from ``MESSAGE_WITH_PARTS``'s rows, or None when there is none."""
    if not rows or rows[0][0] != -1:
        return None
    message = codec.load_model(MESSAGE_ADAPTER, rows[0][1])
    if isinstance(message, AssistantMessage):
        message.content = [codec.load_model(PART_ADAPTER, data) for _, data in rows[1:]]
    return message


async def _insert_message(
    tx: Tx, stored: StoredEvent, message: Any, *, created: int | None = None
) -> None:
    params = {
        "mid": message.id,
        "sid": message.session_id,
        "kind": message.type,
        "message_seq": message.seq,
        "created": stored.created if created is None else created,
        "body": message_row(message),
    }
    if await _INSERT_MESSAGE.first(tx.conn, tx.dialect, params) is None:
        raise LifecycleConflictError(message.id, "a message with this id already exists")
    # A new assistant message has no parts yet (a copied one has: all of them are written).
    parts = len(message.content) if isinstance(message, AssistantMessage) else 0
    _messages(tx)[message.id] = _Loaded(message, changed_parts=set(range(parts)))


async def _save_message(tx: Tx, stored: StoredEvent, message: Any) -> None:
    """``message`` itself changed (not only one of its parts)."""
    _messages(tx)[message.id].updated = stored.created


def _save_part(tx: Tx, message: AssistantMessage, part: Any) -> None:
    """``part`` of ``message`` changed or is new: only its row is written."""
    content = message.content
    position = next(i for i in range(len(content) - 1, -1, -1) if content[i] is part)
    _messages(tx)[message.id].changed_parts.add(position)


async def load_message(tx: Tx, session_id: str, message_id: str) -> Any:
    """The message as this transaction sees it (its own changes included), or None."""
    loaded = _messages(tx)
    entry = loaded.get(message_id)
    if entry is not None:
        return entry.message if entry.message.session_id == session_id else None
    params = {"mid": message_id, "sid": session_id}
    message = assemble(await MESSAGE_WITH_PARTS.rows(tx.conn, tx.dialect, params))
    if message is not None:
        loaded[message_id] = _Loaded(message)
    return message


async def step_waits(tx: Tx, session_id: str, assistant_message_id: str) -> bool:
    """Whether a call of the step still waits, as this transaction sees it: for a person's
    answer, or for its child session (either held the claim past its lease)."""
    message = await load_message(tx, session_id, assistant_message_id)
    if not isinstance(message, AssistantMessage):
        return False
    return any(
        isinstance(p, ToolPart)
        and isinstance(p.state, ToolRunning)
        and (p.state.asked is not None or "child" in p.state.structured)
        for p in message.content
    )


async def _latest_assistant(
    tx: Tx, session_id: str, changes: Callable[[AssistantMessage], bool]
) -> AssistantMessage | None:
    """The session's latest assistant message, as this transaction sees it, if ``changes``
    says the caller is to change it (else None).

    Its parts are read only then: the message's own row answers ``changes`` (which must look at
    the message's own fields only), and a long step's parts are many.
    """
    await _write_back(tx)  # the query must see this transaction's changes
    row = await _LATEST_ASSISTANT.first(tx.conn, tx.dialect, {"sid": session_id})
    return await _changing(tx, session_id, row, changes)


async def _changing(
    tx: Tx, session_id: str, row: Any | None, changes: Callable[[AssistantMessage], bool]
) -> AssistantMessage | None:
    """``_latest_assistant`` from the (id, data) ``row`` already read (after a write-back)."""
    if row is None:
        return None
    message_id, data = row
    if message_id not in _messages(tx):
        head = codec.load_model(MESSAGE_ADAPTER, data)  # the message without its parts
        if not isinstance(head, AssistantMessage) or not changes(head):
            return None
    message = await load_message(tx, session_id, message_id)
    assert isinstance(message, AssistantMessage), message_id
    return message if changes(message) else None


async def _assistant(tx: Tx, event: Any) -> AssistantMessage:
    message = await load_message(tx, event.session_id, event.assistant_message_id)
    if not isinstance(message, AssistantMessage):
        raise InvalidDurableEventError(
            f"Tool event before assistant step start: {event.assistant_message_id}"
        )
    return message


@handles(ev.Synthetic)
async def _synthetic(tx: Tx, stored: StoredEvent, event: ev.Synthetic) -> None:
    message = SyntheticMessage(
        id=derived_message_id(stored.id),
        session_id=event.session_id,
        seq=stored.seq,
        time_created=stored.created,
        text=event.text,
        description=event.description,
        metadata=event.metadata,
    )
    await _insert_message(tx, stored, message)


@handles(ev.InstructionsUpdated)
async def _system(tx: Tx, stored: StoredEvent, event: ev.InstructionsUpdated) -> None:
    message = SystemMessage(
        id=derived_message_id(stored.id),
        session_id=event.session_id,
        seq=stored.seq,
        time_created=stored.created,
        text=event.text,
    )
    await _insert_message(tx, stored, message)


# --- inputs -------------------------------------------------------------------------------------


@handles(ev.PromptAdmitted)
async def _admitted(tx: Tx, stored: StoredEvent, event: ev.PromptAdmitted) -> None:
    if await load_message(tx, event.session_id, event.input_id) is not None:
        raise LifecycleConflictError(event.input_id, "a message with this id already exists")
    params = {
        "id": event.input_id,
        "session_id": event.session_id,
        "prompt": codec.dumps(event.prompt.model_dump(mode="json")),
        "delivery": event.delivery,
        "admitted_seq": stored.seq,
        "time_created": stored.created,
    }
    if await _ADMIT.first(tx.conn, tx.dialect, params) is None:
        raise LifecycleConflictError(event.input_id, "already admitted")
    await _touch(tx, stored)


_ADMIT = Prepared(
    lambda dialect: (
        insert(dialect, input_table)
        .values(
            {
                "type": "prompt",
                **{
                    name: sa.bindparam(name)
                    for name in (
                        "id",
                        "session_id",
                        "prompt",
                        "delivery",
                        "admitted_seq",
                        "time_created",
                    )
                },
            }
        )
        .on_conflict_do_nothing()
        .returning(input_table.c.id)
    )
)


_PENDING_COMPACTION = Prepared(
    lambda _dialect: sa.select(input_table.c.id).where(
        input_table.c.session_id == sa.bindparam("sid"),
        input_table.c.type == "compaction",
        input_table.c.promoted_seq.is_(None),
    )
)


async def pending_compaction(conn: Connection, session_id: str) -> str | None:
    """The id of the session's pending compaction, the barrier in front of every prompt."""
    found = await _PENDING_COMPACTION.scalar(conn, {"sid": session_id})
    return None if found is None else str(found)


@handles(ev.PromptPromoted)
async def _promoted(tx: Tx, stored: StoredEvent, event: ev.PromptPromoted) -> None:
    if await pending_compaction(tx.conn, event.session_id) is not None:
        raise LifecycleConflictError(event.input_id, "a compaction is pending")
    params = {"id": event.input_id, "sid": event.session_id, "seq": stored.seq}
    promoted = await _PROMOTE.first(tx.conn, tx.dialect, params)
    if promoted is None:
        raise LifecycleConflictError(event.input_id, "not pending")
    data = codec.loads(promoted[0])
    message = UserMessage(
        id=event.input_id,
        session_id=event.session_id,
        seq=stored.seq,
        time_created=stored.created,
        text=data["text"],
        files=data.get("files", []),
        metadata=data.get("metadata"),
    )
    await _insert_message(tx, stored, message)
    await _touch(tx, stored)


_PROMOTE = Prepared(
    lambda _dialect: (
        input_table.update()
        .where(
            input_table.c.id == sa.bindparam("id"),
            input_table.c.session_id == sa.bindparam("sid"),
            input_table.c.type == "prompt",
            input_table.c.promoted_seq.is_(None),
        )
        .values(promoted_seq=sa.bindparam("seq"))
        .returning(input_table.c.prompt)
    )
)


@handles(ev.CompactionAdmitted)
async def _compaction_admitted(tx: Tx, stored: StoredEvent, event: ev.CompactionAdmitted) -> None:
    statement = (
        insert(tx.dialect, input_table)
        .values(
            id=event.input_id,
            session_id=event.session_id,
            type="compaction",
            admitted_seq=stored.seq,
            time_created=stored.created,
        )
        .on_conflict_do_nothing()
        .returning(input_table.c.id)
    )
    if not await _inserted(tx, statement):
        raise LifecycleConflictError(event.input_id, "a compaction is already pending")
    message = CompactionMessage(
        id=event.input_id,
        session_id=event.session_id,
        seq=stored.seq,
        time_created=stored.created,
        input_id=event.input_id,
    )
    await _insert_message(tx, stored, message)


@handles(ev.CompactionStarted, ev.CompactionEnded, ev.CompactionFailed)
async def _compaction_progress(tx: Tx, stored: StoredEvent, event: Any) -> None:
    message = None
    if event.input_id is not None:
        message = await load_message(tx, event.session_id, event.input_id)
        if message is not None and not isinstance(message, CompactionMessage):
            raise LifecycleConflictError(event.input_id, "not a compaction")
    if message is None:
        if not isinstance(event, ev.CompactionEnded):
            return  # an automatic compaction has a message once it succeeded, never before
        message = CompactionMessage(
            id=event.compaction_id or derived_message_id(stored.id),
            session_id=event.session_id,
            seq=stored.seq,
            time_created=stored.created,
            reason=event.reason,
        )
        await _insert_message(tx, stored, message)
    if isinstance(event, ev.CompactionStarted):
        message.status = "running"
    elif isinstance(event, ev.CompactionEnded):
        message.status, message.summary, message.recent = "completed", event.summary, event.recent
        message.reason = event.reason
        message.boundary_seq = event.through_seq if event.through_seq is not None else stored.seq
        # The baseline is rebuilt at the compaction point: the next turn freezes a new one.
        settings = await _settings(tx, event.session_id)
        frozen = settings.get("baseline")
        if isinstance(frozen, dict) and isinstance(frozen.get("snapshot"), dict):
            # The sources as last applied: the rebuild falls back on them while the sources
            # cannot be seen (runner #31).
            settings["applied"] = frozen["snapshot"]
        settings["baseline"] = None  # None, not absent: rebuild, do not freeze anew
        await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})
    else:
        message.status = "failed"
    if not isinstance(event, ev.CompactionStarted) and event.input_id is not None:
        # Only this session's compaction input is settled: the barrier it held is released.
        await tx.conn.execute(
            input_table.update()
            .where(
                input_table.c.id == event.input_id,
                input_table.c.session_id == event.session_id,
                input_table.c.type == "compaction",
                input_table.c.promoted_seq.is_(None),
            )
            .values(promoted_seq=stored.seq)
        )
    await _save_message(tx, stored, message)


# --- steps --------------------------------------------------------------------------------------


@handles(ev.StepStarted)
async def _step_started(tx: Tx, stored: StoredEvent, event: ev.StepStarted) -> None:
    message, previous = await _step_opening(tx, event)
    if isinstance(message, AssistantMessage):
        message.retry = message.error = message.finish = message.time_completed = None
        message.agent, message.model = event.agent, event.model
        await _save_message(tx, stored, message)
        return
    if previous is not None:  # a newer step supersedes an older message that never completed
        previous.time_completed = stored.created
        await _save_message(tx, stored, previous)
    await _insert_message(tx, stored, step_message(event, stored.seq, stored.created))


def step_message(event: ev.StepStarted, seq: int, created: int) -> AssistantMessage:
    """The assistant message a new step starts (at its ``step.started``'s seq and time)."""
    return AssistantMessage(
        id=event.assistant_message_id,
        session_id=event.session_id,
        seq=seq,
        time_created=created,
        agent=event.agent,
        model=event.model,
    )


def supersedes(latest: str | None) -> bool:
    """Whether a new step would complete the latest assistant message, from that message's own
    row (``data``; None without one): it never completed."""
    return superseded(latest) is not None


def superseded(latest: str | None) -> str | None:
    """The id of the latest assistant message (its own row, ``data``; None without one) when a
    new step would complete it: it never completed, so it has no terminal event yet."""
    if latest is None:
        return None
    head = codec.load_model(MESSAGE_ADAPTER, latest)
    return head.id if isinstance(head, AssistantMessage) and _incomplete(head) else None


async def _step_opening(
    tx: Tx, event: ev.StepStarted
) -> tuple[Any | None, AssistantMessage | None]:
    """The step's own message (which a retry re-announces), and for a new step the incomplete
    assistant message it supersedes: one read when the transaction has not loaded the former."""
    sid, mid = event.session_id, event.assistant_message_id
    if mid in _messages(tx):
        message = await load_message(tx, sid, mid)
        if isinstance(message, AssistantMessage):
            return message, None
        return message, await _latest_assistant(tx, sid, _incomplete)
    await _write_back(tx)  # the read must see this transaction's changes
    rows = await _STEP_OPENING.rows(tx.conn, tx.dialect, {"sid": sid, "mid": mid})
    found = {int(which): (id, data) for which, id, data in rows}
    message = await load_message(tx, sid, mid) if 0 in found else None
    if isinstance(message, AssistantMessage):
        return message, None
    return message, await _changing(tx, sid, found.get(1), _incomplete)


def _incomplete(message: AssistantMessage) -> bool:
    return message.time_completed is None


def _retrying(message: AssistantMessage) -> bool:
    return message.retry is not None


@handles(ev.StepEnded)
async def _step_ended(tx: Tx, stored: StoredEvent, event: ev.StepEnded) -> None:
    message = await _assistant(tx, event)
    message.finish, message.cost, message.tokens = event.finish, event.cost, event.tokens
    message.files = list(event.files)
    message.time_completed = stored.created
    await _save_message(tx, stored, message)
    await _add_usage(tx, stored, event.cost, event.tokens)


@handles(ev.StepFailed)
async def _step_failed(tx: Tx, stored: StoredEvent, event: ev.StepFailed) -> None:
    message = await _assistant(tx, event)
    message.finish, message.error, message.retry = "error", event.error, None
    message.time_completed = stored.created
    if event.tokens is not None:
        message.tokens = event.tokens
    if event.cost is not None:
        message.cost = event.cost
    await _save_message(tx, stored, message)
    await _add_usage(tx, stored, event.cost, event.tokens)


async def _add_usage(
    tx: Tx, stored: StoredEvent, cost: float | None, tokens: Tokens | None
) -> None:
    """A step's usage into the session's totals. A step that reported tokens counts as priced
    or unpriced (its cost unknown); one that reported none counts as neither."""
    tokens = tokens or Tokens()
    used = token_total(tokens) > 0
    params = {
        "sid": stored.aggregate_id,
        "at": stored.created,
        "cost": cost or 0.0,
        "priced": int(used and cost is not None),
        "unpriced": int(used and cost is None),
        "input": tokens.input,
        "output": tokens.output,
        "reasoning": tokens.reasoning,
        "cache_read": tokens.cache.read,
        "cache_write": tokens.cache.write,
    }
    if tx.conn is None:  # projected in memory (``project_in_memory``): its caller writes it
        tx.cache[_USAGE] = _summed(tx.cache.get(_USAGE), params)
        return
    await _ADD_USAGE.rows(tx.conn, tx.dialect, params)


_USAGE = "projector.usage"
# What a step adds to the session's usage (``_add_usage``'s parameters but the session and date).
USAGE_SUMS: tuple[str, ...] = ("cost", "priced", "unpriced", "input", "output", "reasoning")
USAGE_SUMS += ("cache_read", "cache_write")


def _summed(usage: dict[str, Any] | None, more: dict[str, Any]) -> dict[str, Any]:
    """Two usage additions as one, dated by the later (as two updates leave the row)."""
    if usage is None:
        return more
    return {**more, **{key: usage[key] + more[key] for key in USAGE_SUMS}}


def _add_usage_statement(_dialect: DialectName) -> Any:
    c = session_table.c
    return (
        session_table.update()
        .where(c.id == sa.bindparam("sid"))
        .values(
            cost=c.cost + sa.bindparam("cost", type_=sa.Float),
            steps_priced=c.steps_priced + sa.bindparam("priced", type_=sa.Integer),
            steps_unpriced=c.steps_unpriced + sa.bindparam("unpriced", type_=sa.Integer),
            time_updated=sa.bindparam("at"),
            tokens_input=c.tokens_input + sa.bindparam("input", type_=sa.BigInteger),
            tokens_output=c.tokens_output + sa.bindparam("output", type_=sa.BigInteger),
            tokens_reasoning=c.tokens_reasoning + sa.bindparam("reasoning", type_=sa.BigInteger),
            tokens_cache_read=c.tokens_cache_read + sa.bindparam("cache_read", type_=sa.BigInteger),
            tokens_cache_write=c.tokens_cache_write
            + sa.bindparam("cache_write", type_=sa.BigInteger),
        )
    )


_ADD_USAGE = Prepared(_add_usage_statement)


@handles(ev.RetryScheduled)
async def _retry(tx: Tx, stored: StoredEvent, event: ev.RetryScheduled) -> None:
    message = await _assistant(tx, event)
    message.retry = RetryInfo(attempt=event.attempt, at=event.at, error=event.error)
    await _save_message(tx, stored, message)


# What ends a busy period (``finish_execution``): its projection changes nothing but a retry
# the latest assistant message announced (``_execution_ended``), so on PostgreSQL the store
# writes one in a statement when no retry is pending (``Store.end_execution``).
EXECUTION_END_EVENTS = (ev.ExecutionSucceeded, ev.ExecutionFailed, ev.ExecutionInterrupted)


@handles(*EXECUTION_END_EVENTS)
async def _execution_ended(tx: Tx, stored: StoredEvent, event: ev.SessionEventBase) -> None:
    message = await _latest_assistant(tx, event.session_id, _retrying)
    if message is not None:
        message.retry = None
        await _save_message(tx, stored, message)


# --- text and reasoning -------------------------------------------------------------------------


@handles(ev.TextStarted, ev.TextEnded)
async def _text(tx: Tx, stored: StoredEvent, event: ev.TextStarted | ev.TextEnded) -> None:
    message = await _assistant(tx, event)
    part = None if isinstance(event, ev.TextStarted) else _latest(message, TextPart, event.ordinal)
    if part is None:
        part = TextPart(ordinal=event.ordinal)
        message.content.append(part)
    if isinstance(event, ev.TextEnded):
        part.text = event.text
    _save_part(tx, message, part)


@handles(ev.ReasoningStarted, ev.ReasoningEnded)
async def _reasoning(
    tx: Tx, stored: StoredEvent, event: ev.ReasoningStarted | ev.ReasoningEnded
) -> None:
    message = await _assistant(tx, event)
    part = _latest(message, ReasoningPart, event.ordinal)
    if part is not None and part.time_completed is not None:
        part = None  # reasoning.ended applies to the latest incomplete reasoning only
    if part is None or isinstance(event, ev.ReasoningStarted):
        part = ReasoningPart(ordinal=event.ordinal, time_created=stored.created)
        message.content.append(part)
    part.state = event.state if event.state is not None else part.state
    if isinstance(event, ev.ReasoningEnded):
        part.text, part.time_completed = event.text, stored.created
    _save_part(tx, message, part)


P = TypeVar("P", TextPart, ReasoningPart)


def _latest(message: AssistantMessage, kind: type[P], ordinal: int) -> P | None:
    for part in reversed(message.content):
        if isinstance(part, kind) and part.ordinal == ordinal:
            return part
    return None


# --- tools --------------------------------------------------------------------------------------


@handles(
    ev.ToolInputStarted,
    ev.ToolInputEnded,
    ev.ToolCalled,
    ev.ToolProgress,
    ev.ToolSucceeded,
    ev.ToolFailed,
)
async def _tool(tx: Tx, stored: StoredEvent, event: Any) -> None:
    message = await _assistant(tx, event)
    part = message.tool(event.call_id)
    if isinstance(event, ev.ToolInputStarted | ev.ToolCalled) and (
        part is None or (isinstance(event, ev.ToolInputStarted) and part.settled)
    ):
        part = ToolPart(
            call_id=event.call_id, name=event.name, time=ToolTimes(created=stored.created)
        )
        message.content.append(part)
    if part is None:
        raise InvalidDurableEventError(f"Unknown tool call: {event.call_id}")
    if apply_tool(part, event, stored.created):
        _save_part(tx, message, part)


def apply_tool(part: ToolPart, event: Any, now: int) -> bool:
    """Move a tool part along pending -> running -> completed | error; settled parts stay."""
    state = part.state
    if isinstance(event, ev.ToolInputEnded) and isinstance(state, ToolPending):
        state.input = event.text
    elif isinstance(event, ev.ToolCalled) and isinstance(state, ToolPending):
        part.state = ToolRunning(input=event.input)
        part.executed, part.provider_state, part.time.ran = event.executed, event.state, now
    elif isinstance(event, ev.ToolProgress) and isinstance(state, ToolRunning):
        state.structured, state.content = event.structured, list(event.content)
    elif isinstance(event, ev.ToolSucceeded) and isinstance(state, ToolRunning):
        part.state = ToolCompleted(
            input=state.input,
            structured=event.structured,
            content=list(event.content),
            output_paths=list(event.output_paths),
            result=event.result,
        )
        part.provider_result_state, part.time.completed = event.result_state, now
    elif isinstance(event, ev.ToolFailed) and isinstance(state, ToolPending | ToolRunning):
        running = state if isinstance(state, ToolRunning) else ToolRunning()
        part.state = ToolError(
            error=event.error,
            input=running.input,
            structured=running.structured,
            content=running.content,
            result=event.result,
        )
        part.provider_result_state, part.time.completed = event.result_state, now
    else:
        return isinstance(event, ev.ToolInputStarted)
    return True


# --- a turn's parts, projected in memory -----------------------------------------------------

# What a turn streams into its assistant message, whose projection changes only that message's
# parts: ``project_parts`` runs their handlers on a message the caller keeps (the turn's view),
# so the turn's writer can send the changed parts with the events in one statement.
PART_EVENTS = (
    ev.TextStarted,
    ev.TextEnded,
    ev.ReasoningStarted,
    ev.ReasoningEnded,
    ev.ToolInputStarted,
    ev.ToolInputEnded,
    ev.ToolCalled,
)


def parts_only(message: AssistantMessage, events: Sequence[ev.Event]) -> bool:
    """Whether ``events`` change nothing but parts of ``message`` that no one else writes.

    A tool part is the turn's own until it is called; from then on the tool's run settles it,
    so an event on a called part (a reused call id) is left to the general path, which reads it.
    """
    for event in events:
        if not isinstance(event, PART_EVENTS):
            continue
        if event.assistant_message_id != message.id or event.session_id != message.session_id:
            return False
        if isinstance(event, ev.ToolInputStarted | ev.ToolInputEnded | ev.ToolCalled):
            part = message.tool(event.call_id)
            if part is not None and not isinstance(part.state, ToolPending):
                return False
    return True


async def project_parts(
    message: AssistantMessage, stored: Sequence[StoredEvent]
) -> list[dict[str, Any]]:
    """Apply ``stored`` (``parts_only`` events, deltas among them) to ``message`` in memory;
    the rows of the parts that changed, as ``session_part`` stores them."""
    return (await project_in_memory(message, stored)).parts


# What ends a step (``finish_step``): its end or failure, and its calls left unsettled failed.
# Their projection changes the step's message, its parts and the session's usage, and nothing
# else, so on PostgreSQL the store projects them in memory on the message as it read it and
# writes the outcome with the events in one statement (``Store.end_step``).
STEP_END_EVENTS = (ev.StepEnded, ev.StepFailed, ev.ToolFailed)


def retry_pending(data: str) -> bool:
    """Whether a message as stored (its own row, without parts) announces a retry."""
    message = codec.load_model(MESSAGE_ADAPTER, data)
    return isinstance(message, AssistantMessage) and _retrying(message)


def ends_step_only(message: AssistantMessage, events: Sequence[ev.Event]) -> bool:
    """Whether ``events`` are all ``STEP_END_EVENTS`` of ``message``."""
    return all(
        isinstance(event, STEP_END_EVENTS)
        and event.session_id == message.session_id
        and event.assistant_message_id == message.id
        for event in events
    )


@dataclass(frozen=True)
class Projected:
    """What events projected in memory changed: the message's own row and when (None when
    unchanged), the rows of the parts that changed, and the session's usage to add (the
    parameters of ``_ADD_USAGE``; None when there is none)."""

    row: str | None
    updated: int | None
    parts: list[dict[str, Any]]
    usage: dict[str, Any] | None


async def project_in_memory(message: AssistantMessage, stored: Sequence[StoredEvent]) -> Projected:
    """Apply ``stored`` to ``message`` in memory: events whose projection changes nothing but
    that message and the session's usage (``parts_only`` or ``ends_step_only`` events)."""
    tx = Tx(conn=None, dialect="postgresql")
    entry = _messages(tx)[message.id] = _Loaded(message)
    tx.before_commit.clear()
    for event in stored:
        handler = _HANDLERS.get(type(event.data))
        if handler is not None:
            await handler(tx, event, event.data)
    return Projected(
        row=None if entry.updated is None else message_row(message),
        updated=entry.updated,
        parts=[_part_row(message, position) for position in sorted(entry.changed_parts)],
        usage=tx.cache.get(_USAGE),
    )


def cached_message(tx: Tx, message_id: str) -> Any | None:
    """The message as ``tx`` left it, if ``tx`` read or wrote it (None otherwise)."""
    loaded: dict[str, _Loaded] = tx.cache.get(_MESSAGES, {})
    entry = loaded.get(message_id)
    return None if entry is None else entry.message


# --- permissions and questions ------------------------------------------------------------------


@handles(ev.PermissionAsked, ev.PermissionReplied)
async def _permission(tx: Tx, stored: StoredEvent, event: Any) -> None:
    """The call's part shows what it waits on until it is answered; an ``always`` answer's
    rules join the session's settings (``always``), where the policy reads them."""
    request = event.request if isinstance(event, ev.PermissionAsked) else None
    message_id = request.assistant_message_id if request else event.assistant_message_id
    call_id = request.call_id if request else event.call_id
    message = await load_message(tx, event.session_id, message_id)
    part = message.tool(call_id) if isinstance(message, AssistantMessage) else None
    if part is not None and isinstance(part.state, ToolRunning):
        part.state.asked = request
        _save_part(tx, message, part)
    if isinstance(event, ev.PermissionReplied) and event.rules:
        await _add_always_rules(tx, event)


async def _add_always_rules(tx: Tx, event: ev.PermissionReplied) -> None:
    row = (
        await tx.conn.execute(
            sa.select(session_table.c.settings).where(session_table.c.id == event.session_id)
        )
    ).first()
    settings = dict(codec.loads(row[0]) or {}) if row is not None and row[0] else {}
    rules = [*settings.get("always", []), *(r.model_dump(mode="json") for r in event.rules)]
    settings["always"] = rules
    await _update_session(tx, event.session_id, {"settings": codec.dumps(settings)})
