"""Durable input admission and promotion (reference §4.1, §4.2).

Admission is idempotent by input id: the same content returns the stored receipt, different
content is a conflict. A pending compaction is a barrier: no prompt is promoted while it waits.
Promotion runs inside the drain's fenced transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from sessionflow.errors import (
    AdmissionUnavailableError,
    InputConflictError,
    LifecycleConflictError,
    SessionNotFoundError,
    StoreUnavailableError,
    TransactionConflictError,
    UnencodableTextError,
)
from sessionflow.ids import message_id, validate_id
from sessionflow.models import events as ev
from sessionflow.models.common import Delivery, Prompt
from store import codec
from store.db import Connection, Database, Tx
from store.events import EventStore
from store.prepared import Prepared, dialect_of_connection
from store.projector import pending_compaction
from store.schema import input_table, session_table

_i = input_table.c
ADMIT_ATTEMPTS = 4
_ADMIT_BACKOFF_S = 0.05


@dataclass(frozen=True)
class InputReceipt:
    id: str
    session_id: str
    type: str
    prompt: Prompt | None
    delivery: Delivery | None
    admitted_seq: int
    promoted_seq: int | None
    time_created: int

    def equivalent(self, session_id: str, prompt: Prompt, delivery: Delivery) -> bool:
        return (
            self.session_id == session_id
            and self.type == "prompt"
            and self.delivery == delivery
            and self.prompt is not None
            and self.prompt.model_dump(mode="json") == prompt.model_dump(mode="json")
        )


Waiting = tuple[bool, bool, str | None]


def waiting(steer: Any, queue: Any, compaction: Any) -> Waiting:
    """(steer, queue, compaction) from a read of whether each waits (``_WAITING``'s row)."""
    if compaction is not None:
        return False, False, str(compaction)  # prompts wait behind the barrier
    return bool(steer), bool(queue), None


class Inputs:
    def __init__(self, db: Database, events: EventStore) -> None:
        self.db = db
        self.events = events

    async def admit(
        self,
        session_id: str,
        prompt: Prompt | str,
        *,
        input_id: str | None = None,
        delivery: Delivery = "steer",
    ) -> InputReceipt:
        """Record a prompt durably; idempotent by ``input_id`` (the future user message id).

        A database failure that may have committed or not (a busy database, a serialization
        failure, a connection lost mid-commit) is retried under the same id, minted once before
        the first attempt: a commit whose acknowledgement was lost is found, not admitted twice.
        """
        validate_id(session_id)
        prompt = Prompt(text=prompt) if isinstance(prompt, str) else prompt
        if delivery not in ("steer", "queue"):
            raise ValueError(f"Unknown delivery {delivery!r}: use 'steer' or 'queue'")
        _require_model_text(prompt)
        fresh = input_id is None
        input_id = validate_id(input_id, "input") if input_id is not None else message_id()
        attempt = 1
        while True:
            try:
                # Only a fresh id on its first attempt cannot have been admitted before.
                look = not fresh or attempt > 1
                return await self._admit(session_id, input_id, prompt, delivery, look=look)
            except (sa.exc.DBAPIError, TransactionConflictError, StoreUnavailableError) as error:
                # The store's writes surface the database's transient refusals typed.
                if isinstance(error, sa.exc.DBAPIError) and not _transient(error):
                    raise
                if attempt == ADMIT_ATTEMPTS:
                    orig = error.orig if isinstance(error, sa.exc.DBAPIError) else error
                    cause = str(orig)[:200]
                    raise AdmissionUnavailableError(session_id, input_id, attempt, cause) from error
            await asyncio.sleep(_ADMIT_BACKOFF_S * attempt)
            attempt += 1

    async def _admit(
        self, session_id: str, input_id: str, prompt: Prompt, delivery: Delivery, *, look: bool
    ) -> InputReceipt:
        existing = await self.get(input_id) if look else None
        if existing is None:
            event = ev.PromptAdmitted(
                session_id=session_id, input_id=input_id, prompt=prompt, delivery=delivery
            )
            try:
                async with self.db.write() as tx:
                    await _require_session(tx.conn, session_id)
                    stored = await self.events.publish(event, tx=tx)
                return InputReceipt(
                    id=input_id,
                    session_id=session_id,
                    type="prompt",
                    prompt=prompt,
                    delivery=delivery,
                    admitted_seq=stored.seq,
                    promoted_seq=None,
                    time_created=stored.created,
                )
            except LifecycleConflictError:
                pass  # a concurrent admission of the same id won; compare with it below
            existing = await self.get(input_id)
        if existing is None or not existing.equivalent(session_id, prompt, delivery):
            raise InputConflictError(input_id)
        return existing

    async def admit_compaction(self, session_id: str, *, input_id: str | None = None) -> str:
        """Queue a manual compaction; while one is pending, a second request returns it."""
        validate_id(session_id)
        input_id = validate_id(input_id, "input") if input_id is not None else message_id()
        existing = await self.get(input_id)
        if existing is not None:
            if existing.type != "compaction" or existing.session_id != session_id:
                raise LifecycleConflictError(input_id, "the id belongs to another input")
            return existing.id
        try:
            async with self.db.write() as tx:
                await _require_session(tx.conn, session_id)
                pending = await pending_compaction(tx.conn, session_id)
                if pending is not None:
                    return pending
                event = ev.CompactionAdmitted(session_id=session_id, input_id=input_id)
                await self.events.publish(event, tx=tx)
                return input_id
        except LifecycleConflictError:
            async with self.db.read() as conn:
                pending = await pending_compaction(conn, session_id)
            if pending is None:
                raise
            return pending

    async def get(self, input_id: str, *, tx: Tx | None = None) -> InputReceipt | None:
        async with self.db.reading(tx) as conn:
            row = await _INPUT.first(conn, self.db.dialect, {"id": input_id})
        return None if row is None else _receipt(dict(zip(_INPUT_COLUMNS, row, strict=True)))

    async def pending(self, session_id: str, *, tx: Tx | None = None) -> list[InputReceipt]:
        """Inputs not yet promoted (or, for compactions, not yet handled), in admission order
        (read in ``tx`` when given)."""
        query = (
            sa.select(input_table)
            .where(_i.session_id == session_id, _i.promoted_seq.is_(None))
            .order_by(_i.admitted_seq)
        )
        async with self.db.reading(tx) as conn:
            return [_receipt(row._mapping) for row in (await conn.execute(query)).all()]

    async def pending_deliveries(
        self, session_id: str, *, tx: Tx | None = None
    ) -> tuple[bool, bool]:
        """(steer, queue): whether each kind could be promoted now, in one read (or in ``tx``)."""
        if tx is not None:
            return await _deliveries(tx.conn, session_id)
        async with self.db.read() as conn:
            return await _deliveries(conn, session_id)

    async def waiting(self, session_id: str, *, tx: Tx | None = None) -> Waiting:
        """(steer, queue, compaction): ``pending_deliveries`` and ``pending_compaction`` in one
        statement (on PostgreSQL one round trip, without a transaction), or in ``tx``."""
        params = {"sid": session_id}
        if tx is not None:
            row = await _WAITING.first(tx.conn, tx.dialect, params)
        else:
            async with self.db.read(single=True) as conn:
                row = await _WAITING.first(conn, self.db.dialect, params)
        assert row is not None
        return waiting(*row)

    async def pending_compaction(self, session_id: str, *, tx: Tx | None = None) -> str | None:
        """The id of the session's pending compaction (the barrier), if there is one."""
        if tx is not None:
            return await pending_compaction(tx.conn, session_id)
        async with self.db.read() as conn:
            return await pending_compaction(conn, session_id)

    async def has_pending(self, session_id: str, delivery: Delivery) -> bool:
        """Whether a prompt of ``delivery`` could be promoted now (false behind a compaction)."""
        steer, queue = await self.pending_deliveries(session_id)
        return steer if delivery == "steer" else queue

    async def promote_steers(self, tx: Tx, session_id: str) -> int:
        """Promote every pending steer, in admission order; returns how many."""
        if await pending_compaction(tx.conn, session_id) is not None:
            return 0
        params = {"sid": session_id, "delivery": "steer"}
        ids = [i for (i,) in await _PENDING_PROMPTS.rows(tx.conn, tx.dialect, params)]
        await self.events.publish_many(
            [ev.PromptPromoted(session_id=session_id, input_id=i) for i in ids], tx=tx
        )
        return len(ids)

    async def promote_next_queued(self, tx: Tx, session_id: str) -> bool:
        """Promote the single oldest queued prompt; returns whether there was one."""
        if await pending_compaction(tx.conn, session_id) is not None:
            return False
        params = {"sid": session_id, "delivery": "queue"}
        pending = await _PENDING_PROMPTS.first(tx.conn, tx.dialect, params)
        if pending is None:
            return False
        next_id = pending[0]
        await self.events.publish(ev.PromptPromoted(session_id=session_id, input_id=next_id), tx=tx)
        return True


# A session's pending prompts of one delivery, in admission order.
_PENDING_PROMPTS = Prepared(
    lambda _dialect: (
        sa.select(_i.id)
        .where(
            _i.session_id == sa.bindparam("sid"),
            _i.type == "prompt",
            _i.delivery == sa.bindparam("delivery"),
            _i.promoted_seq.is_(None),
        )
        .order_by(_i.admitted_seq)
    )
)


async def _deliveries(conn: Connection, session_id: str) -> tuple[bool, bool]:
    if await pending_compaction(conn, session_id) is not None:
        return False, False
    kinds = {
        kind
        for (kind,) in await _DELIVERIES.rows(
            conn, dialect_of_connection(conn), {"sid": session_id}
        )
    }
    return "steer" in kinds, "queue" in kinds


_DELIVERIES = Prepared(
    lambda _dialect: (
        sa.select(_i.delivery)
        .where(_i.session_id == sa.bindparam("sid"), _i.type == "prompt", _i.promoted_seq.is_(None))
        .distinct()
    )
)


def _waiting_prompt(delivery: str) -> Any:
    return (
        sa.exists()
        .where(
            _i.session_id == sa.bindparam("sid"),
            _i.type == "prompt",
            _i.delivery == delivery,
            _i.promoted_seq.is_(None),
        )
        .label(f"{delivery}_pending")
    )


_WAITING = Prepared(
    lambda _dialect: sa.select(
        _waiting_prompt("steer"),
        _waiting_prompt("queue"),
        sa.select(_i.id)
        .where(
            _i.session_id == sa.bindparam("sid"),
            _i.type == "compaction",
            _i.promoted_seq.is_(None),
        )
        .limit(1)
        .scalar_subquery()
        .label("compaction"),
    )
)


def _transient(error: sa.exc.DBAPIError) -> bool:
    """A failure that says nothing about the admission itself: the database was busy, aborted
    the transaction (serialization, deadlock) or lost the connection, maybe after the commit."""
    return isinstance(error, sa.exc.OperationalError) or error.connection_invalidated


def _require_model_text(prompt: Prompt) -> None:
    """Refuse a prompt whose text for the model holds a lone surrogate.

    The store would keep it exactly, but no provider request can carry it: refused here, the
    caller learns at once what was wrong, instead of the model reading U+FFFD in its place.
    """
    fields = [("The prompt text", prompt.text)]
    for n, file in enumerate(prompt.files, 1):
        named = (("name", file.name), ("description", file.description), ("mime", file.mime))
        fields += [(f"Attachment {n}'s {key}", value) for key, value in named if value]
    for what, text in fields:
        index = codec.first_surrogate(text)
        if index is not None:
            raise UnencodableTextError(what, index, ord(text[index]))


async def _require_session(conn: Connection, session_id: str) -> None:
    if await _SESSION_EXISTS.scalar(conn, {"sid": session_id}) is None:
        raise SessionNotFoundError(session_id)


_SESSION_EXISTS = Prepared(
    lambda _dialect: sa.select(session_table.c.id).where(session_table.c.id == sa.bindparam("sid"))
)
_INPUT_COLUMNS = tuple(c.name for c in input_table.columns)
_INPUT = Prepared(lambda _dialect: sa.select(input_table).where(_i.id == sa.bindparam("id")))


def _receipt(m: Mapping[str, Any]) -> InputReceipt:
    prompt = Prompt.model_validate(codec.loads(m["prompt"])) if m["prompt"] else None
    return InputReceipt(
        id=m["id"],
        session_id=m["session_id"],
        type=m["type"],
        prompt=prompt,
        delivery=m["delivery"],
        admitted_seq=int(m["admitted_seq"]),
        promoted_seq=None if m["promoted_seq"] is None else int(m["promoted_seq"]),
        time_created=int(m["time_created"]),
    )
