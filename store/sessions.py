"""Sessions: creation (as an event), lookup, listing, and the projected transcript."""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from sessionflow.errors import SessionBusyError, SessionNotFoundError
from sessionflow.ids import session_id as new_session_id
from sessionflow.ids import validate_host, validate_id
from sessionflow.models import events as ev
from sessionflow.models.common import CacheTokens, ModelRef, Tokens
from sessionflow.models.drain import LOCAL_HOST
from sessionflow.models.messages import MESSAGE_ADAPTER, AssistantMessage, Message, ToolPart
from sessionflow.models.spend import Budget, Spend
from store import codec
from store.db import Database, Tx
from store.dialect import for_update, now_ms
from store.events import EventStore
from store.prepared import Prepared
from store.projector import PART_ADAPTER
from store.schema import (
    execution_table,
    input_table,
    message_table,
    part_table,
    sequence_table,
    session_table,
)

DEFAULT_LIST_LIMIT = 100
_s = session_table.c


@dataclass(frozen=True)
class SessionInfo:
    id: str
    directory: str
    title: str
    model: ModelRef | None
    agent: str | None
    workspace_id: str | None
    parent_id: str | None
    settings: dict[str, Any]
    cost: float
    tokens: Tokens
    time_created: int
    time_updated: int
    requests: int = 0  # provider requests made so far (retries and summaries count)
    host: str = LOCAL_HOST  # whose workers run its tools (``store/hosts.py``)
    # What the session itself spent (``cost`` and ``tokens`` with how many steps were priced;
    # its subagents' spend is theirs) and may spend (``settings["budget"]``).
    spend: Spend = field(default_factory=Spend)
    budget: Budget | None = None


@dataclass(frozen=True)
class Pending:
    """What waits to be promoted, as a turn's opening reads it with the session."""

    compaction: bool  # a pending compaction: the barrier in front of every prompt
    steer: bool
    queue: bool


@dataclass(frozen=True)
class StepBasis:
    """What a step's start would find, as a turn's opening read it under the claim: the
    session's last seq, whether the step's message exists (in any session: ids are unique),
    and the latest assistant message's own row (None without one). Every projection moves the
    session's seq, so while it is still ``seq`` a start finds the same (``Store.append`` with
    a ``TurnView`` carrying it)."""

    seq: int
    exists: bool
    latest: str | None

    def after(self, tx: Tx, session_id: str) -> StepBasis:
        """This basis once ``tx`` has written: its seq moves past what ``tx`` appended to the
        session, only if nothing else came between (else it stays, and the step's start, which
        then finds the log moved, takes the general path)."""
        last, count = tx.allocated.get(session_id, (self.seq, 0))
        return replace(self, seq=last) if last - count == self.seq else self


@dataclass(frozen=True)
class TurnSnapshot:
    """A turn's opening read outside any transaction (``Sessions.turn_snapshot``): what
    ``Sessions.opening`` reads, and the version of the session's claim row then, which a write
    decided from it fences on (``Store.open_turn``)."""

    session: SessionInfo
    pending: Pending
    basis: StepBasis
    version: str


# A read of one statement's rows (``PostgresWriter.fetch_prepared``).
Fetch = Callable[[Prepared, dict[str, Any]], Awaitable[list[tuple[Any, ...]]]]


_COUNT_REQUEST = Prepared(
    lambda _dialect: (
        session_table.update()
        .where(session_table.c.id == sa.bindparam("sid"))
        .values(request_count=session_table.c.request_count + 1)
        .returning(session_table.c.request_count)
    )
)


class Sessions:
    """``fetch``: how a read of one statement runs without SQLAlchemy (on PostgreSQL, over the
    hot path's own connections: no pool checkout, no async bridge); without it, in a read of
    its own."""

    def __init__(self, db: Database, events: EventStore, *, fetch: Fetch | None = None) -> None:
        self.db = db
        self.events = events
        self.fetch = fetch

    async def _read(
        self, statement: Prepared, params: dict[str, Any], *, tx: Tx | None = None
    ) -> list[Any]:
        """A read of one statement: in ``tx`` when the caller holds one (never a second
        connection, ``Database.reading``), else on its own connection."""
        if tx is not None:
            return await statement.rows(tx.conn, tx.dialect, params)
        if self.fetch is not None:
            return await self.fetch(statement, params)
        async with self.db.read(single=True) as conn:
            return await statement.rows(conn, self.db.dialect, params)

    async def count_request(self, tx: Tx, session_id: str) -> int:
        """Count one provider request (inside a fenced ``tx``); returns its 0-based index."""
        ((count,),) = await _COUNT_REQUEST.rows(tx.conn, tx.dialect, {"sid": session_id})
        return int(count) - 1

    async def create(
        self,
        directory: str,
        *,
        session_id: str | None = None,
        title: str = "",
        model: ModelRef | str | None = None,
        agent: str | None = None,
        workspace_id: str | None = None,
        parent_id: str | None = None,
        settings: dict[str, Any] | None = None,
        host: str | None = None,
        observed: dict[str, str] | None = None,
    ) -> SessionInfo:
        """Create a session; its ``session.created`` event is seq 0 of its log."""
        sid = validate_id(session_id) if session_id is not None else new_session_id()
        for kind, value in (("workspace", workspace_id), ("parent session", parent_id)):
            if value is not None:
                validate_id(value, kind)
        event = ev.SessionCreated(
            session_id=sid,
            directory=directory,
            title=title,
            model=ModelRef.parse(model) if isinstance(model, str) else model,
            agent=agent,
            workspace_id=workspace_id,
            parent_id=parent_id,
            settings=settings,
            host=None if host in (None, LOCAL_HOST) else validate_host(host),
            observed=observed,
        )
        await self.events.publish(event)
        return await self.get(sid)

    async def move(
        self,
        session_id: str,
        host: str,
        directory: str,
        *,
        observed: dict[str, str] | None = None,
    ) -> SessionInfo:
        """Record ``session.moved`` to ``host`` and ``directory``, only while no live claim
        holds the session (``SessionBusyError``). The session row is locked first: a busy
        period's claim writes it (its epoch), so the check and the event cannot interleave
        with a claim being granted."""
        validate_host(host)

        async def move(tx: Tx) -> None:
            lock = for_update(
                tx.dialect, sa.select(_s.host, _s.directory).where(_s.id == session_id)
            )
            row = (await tx.conn.execute(lock)).first()
            if row is None:
                raise SessionNotFoundError(session_id)
            live = sa.select(execution_table.c.id).where(
                execution_table.c.session_id == session_id,
                execution_table.c.expires_at > now_ms(tx.dialect),
            )
            if (await tx.conn.execute(live)).first() is not None:
                raise SessionBusyError(session_id, "a session moves")
            event = ev.SessionMoved(
                session_id=session_id,
                host=host,
                directory=directory,
                previous_host=row.host or LOCAL_HOST,
                previous_directory=row.directory,
                observed=observed,
            )
            await self.events.publish(event, tx=tx)

        await self.db.transact(move)
        return await self.get(session_id)

    async def get(self, session_id: str, *, tx: Tx | None = None) -> SessionInfo:
        """The session as of now, or as ``tx`` sees it when given."""
        validate_id(session_id)
        params = {"sid": session_id}
        if tx is not None:
            row = await _SESSION.first(tx.conn, self.db.dialect, params)
        else:
            row = next(iter(await self._read(_SESSION, params)), None)
        if row is None:
            raise SessionNotFoundError(session_id)
        return _info(SimpleNamespace(**dict(zip(_SESSION_COLUMNS, row, strict=True))))

    async def exists(self, session_id: str) -> bool:
        validate_id(session_id)
        return bool(await self._read(_SESSION, {"sid": session_id}))

    async def opening(
        self, tx: Tx, session_id: str, message_id: str
    ) -> tuple[SessionInfo, Pending, StepBasis]:
        """The session, what waits to be promoted and what the step of ``message_id`` would
        start on, in one statement inside ``tx``: a turn's opening, which promotes only what
        this says is there (no read per delivery)."""
        validate_id(session_id)
        params = {"sid": session_id, "mid": message_id}
        row = await _OPENING.first(tx.conn, tx.dialect, params)
        if row is None:
            raise SessionNotFoundError(session_id)
        return _opening(row)

    async def turn_snapshot(self, session_id: str, message_id: str) -> TurnSnapshot | None:
        """What ``opening`` reads, outside any transaction, with the claim row's version; on
        PostgreSQL only (None elsewhere, or when the session has no claim)."""
        if self.fetch is None or self.db.dialect != "postgresql":
            return None
        validate_id(session_id)
        params = {"sid": session_id, "mid": message_id}
        row = next(iter(await self.fetch(_TURN_SNAPSHOT, params)), None)
        if row is None:
            raise SessionNotFoundError(session_id)
        *opened, version = row
        if version is None:
            return None
        return TurnSnapshot(*_opening(opened), version=str(version))

    async def list(
        self,
        *,
        directory: str | None = None,
        workspace_id: str | None = None,
        search: str | None = None,
        roots_only: bool = False,
        parent_id: str | None = None,
        updated_since: int | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
    ) -> list[SessionInfo]:
        """Sessions, most recently updated first (then by id, newest first)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        query = sa.select(session_table).order_by(_s.time_updated.desc(), _s.id.desc())
        if directory is not None:
            query = query.where(_s.directory == directory)
        if workspace_id is not None:
            query = query.where(_s.workspace_id == workspace_id)
        if search:
            # Case-insensitive on both databases (SQLite LIKE already is, PostgreSQL's is not).
            query = query.where(sa.func.lower(_s.title).contains(search.lower(), autoescape=True))
        if roots_only:
            query = query.where(_s.parent_id.is_(None))
        if parent_id is not None:
            query = query.where(_s.parent_id == validate_id(parent_id, "parent session"))
        if updated_since is not None:
            query = query.where(_s.time_updated >= updated_since)
        async with self.db.read(single=True) as conn:
            rows = (await conn.execute(query.limit(limit))).all()
        return [_info(row) for row in rows]

    async def tool_part(self, session_id: str, message_id: str, call_id: str) -> ToolPart | None:
        """The latest tool part of ``call_id`` in an assistant message (None if there is none).

        Reads and validates that one part, not the whole message: a tool activity needs only
        its call.
        """
        params = {"mid": message_id, "sid": session_id, "cid": call_id}
        row = next(iter(await self._read(_TOOL_PART, params)), None)
        return _tool_part(None if row is None else row[0])

    async def tool_call(
        self, session_id: str, message_id: str, call_id: str
    ) -> tuple[SessionInfo, StoredPart | None]:
        """The session and the latest tool part of one call as stored, in one statement (what
        a tool activity reads before it runs)."""
        validate_id(session_id)
        params = {"sid": session_id, "mid": message_id, "cid": call_id}
        row = next(iter(await self._read(_SESSION_AND_TOOL_PART, params)), None)
        if row is None:
            raise SessionNotFoundError(session_id)
        *columns, position, data = row
        info = _info(SimpleNamespace(**dict(zip(_SESSION_COLUMNS, columns, strict=True))))
        part = _tool_part(data)
        return info, None if part is None else StoredPart(part, int(position), data)

    async def messages(self, session_id: str, *, tx: Tx | None = None) -> builtins.list[Message]:
        """The projected history, in seq order (read in ``tx`` when given)."""
        validate_id(session_id)
        rows = await self._read(_MESSAGES, {"sid": session_id}, tx=tx)
        messages: builtins.list[Message] = []
        for _seq, position, data in rows:  # each message, then its parts (one snapshot)
            if position == -1:
                messages.append(codec.load_model(MESSAGE_ADAPTER, data))
                continue
            owner = messages[-1]
            assert isinstance(owner, AssistantMessage), owner.id
            owner.content.append(codec.load_model(PART_ADAPTER, data))
        return messages


_SESSION_COLUMNS = tuple(c.name for c in session_table.columns)
_SESSION = Prepared(lambda _dialect: sa.select(session_table).where(_s.id == sa.bindparam("sid")))
_i = input_table.c


def _waiting(*conditions: Any) -> Any:
    return sa.exists().where(
        _i.session_id == sa.bindparam("sid"), _i.promoted_seq.is_(None), *conditions
    )


_m, _p = message_table.c, part_table.c


def _latest_assistant(column: Any) -> Any:
    return (
        sa.select(column)
        .where(_m.session_id == sa.bindparam("sid"), _m.type == "assistant")
        .order_by(_m.seq.desc())
        .limit(1)
        .scalar_subquery()
    )


def _opening_query() -> Any:
    return sa.select(
        session_table,
        _waiting(_i.type == "compaction").label("compaction_pending"),
        _waiting(_i.type == "prompt", _i.delivery == "steer").label("steer_pending"),
        _waiting(_i.type == "prompt", _i.delivery == "queue").label("queue_pending"),
        # The step's basis (``StepBasis``).
        sa.select(sequence_table.c.seq)
        .where(sequence_table.c.aggregate_id == sa.bindparam("sid"))
        .scalar_subquery()
        .label("last_seq"),
        sa.exists().where(_m.id == sa.bindparam("mid")).label("message_exists"),
        _latest_assistant(_m.data).label("latest_assistant"),
    ).where(_s.id == sa.bindparam("sid"))


_OPENING = Prepared(lambda _dialect: _opening_query())
# PostgreSQL only: the claim row's version (``xmin``: the transaction that last wrote it).
_TURN_SNAPSHOT = Prepared(
    lambda _dialect: _opening_query().add_columns(
        sa.select(sa.literal_column("session_execution.xmin::text"))
        .select_from(execution_table)
        .where(execution_table.c.session_id == sa.bindparam("sid"))
        .scalar_subquery()
        .label("claim_version")
    )
)


def _opening(row: Sequence[Any]) -> tuple[SessionInfo, Pending, StepBasis]:
    """``opening``'s answer from its statement's row."""
    columns, flags = row[: len(_SESSION_COLUMNS)], row[len(_SESSION_COLUMNS) :]
    info = _info(SimpleNamespace(**dict(zip(_SESSION_COLUMNS, columns, strict=True))))
    compaction, steer, queue, seq, exists, latest = flags
    pending = Pending(compaction=bool(compaction), steer=bool(steer), queue=bool(queue))
    # A session without a log row yet (none is made so) would have its first event at seq 0.
    last = -1 if seq is None else int(seq)
    return info, pending, StepBasis(last, bool(exists), latest)


# Every message in seq order, each followed by its parts in order, in one statement.
_MESSAGES = Prepared(
    lambda _dialect: sa.union_all(
        sa.select(_m.seq, sa.literal_column("-1").label("position"), _m.data).where(
            _m.session_id == sa.bindparam("sid")
        ),
        sa.select(_m.seq, _p.position, _p.data)
        .join_from(part_table, message_table, _p.message_id == _m.id)
        .where(_p.session_id == sa.bindparam("sid")),
    ).order_by(sa.literal_column("seq"), sa.literal_column("position"))
)


def _tool_part_query() -> Any:
    return (
        sa.select(part_table.c.data)
        .where(
            part_table.c.message_id == sa.bindparam("mid"),
            part_table.c.session_id == sa.bindparam("sid"),
            part_table.c.call_id == sa.bindparam("cid"),
        )
        .order_by(part_table.c.position.desc())
        .limit(1)
    )


_TOOL_PART = Prepared(lambda _dialect: _tool_part_query())
_SESSION_AND_TOOL_PART = Prepared(
    lambda _dialect: sa.select(
        session_table,
        _tool_part_query().with_only_columns(_p.position).scalar_subquery(),
        _tool_part_query().scalar_subquery(),
    ).where(_s.id == sa.bindparam("sid"))
)


@dataclass(frozen=True)
class StoredPart:
    """A tool part as its row holds it: where it is in its message, and its stored JSON (what
    a write that expects the part unchanged compares against)."""

    part: ToolPart
    position: int
    data: str


def _tool_part(encoded: str | None) -> ToolPart | None:
    if encoded is None:
        return None
    part = codec.load_model(PART_ADAPTER, encoded)
    return part if isinstance(part, ToolPart) else None


def _info(row: Any) -> SessionInfo:
    settings = codec.loads(row.settings) if row.settings else {}
    tokens = Tokens(
        input=row.tokens_input,
        output=row.tokens_output,
        reasoning=row.tokens_reasoning,
        cache=CacheTokens(read=row.tokens_cache_read, write=row.tokens_cache_write),
    )
    return SessionInfo(
        id=row.id,
        directory=row.directory,
        title=row.title,
        model=ModelRef.model_validate(codec.loads(row.model)) if row.model else None,
        agent=row.agent,
        workspace_id=row.workspace_id,
        parent_id=row.parent_id,
        settings=settings,
        requests=int(row.request_count or 0),
        host=row.host or LOCAL_HOST,
        cost=float(row.cost),
        tokens=tokens,
        spend=Spend(
            tokens=tokens,
            usd=float(row.cost),
            priced_steps=int(row.steps_priced or 0),
            unpriced_steps=int(row.steps_unpriced or 0),
        ),
        budget=Budget.model_validate(settings["budget"]) if settings.get("budget") else None,
        time_created=int(row.time_created),
        time_updated=int(row.time_updated),
    )
