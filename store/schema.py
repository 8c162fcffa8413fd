"""The schema: SQLAlchemy 2 typed models, one schema for SQLite and PostgreSQL.

Times are epoch milliseconds (BIGINT) from the database clock wherever they fence anything.
JSON lives in TEXT columns written by ``store.codec`` (not JSONB: PostgreSQL's JSONB rejects
``\\u0000``, and one normalization must hold on both databases). The store works with Core
statements over ``Model.__table__``; the ORM classes are the typed schema definition.
"""

from __future__ import annotations

from typing import Annotated, cast

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

Millis = Annotated[int, mapped_column(sa.BigInteger)]
Seq = Annotated[int, mapped_column(sa.BigInteger)]
Id = Annotated[str, mapped_column(sa.String(128))]
JsonText = Annotated[str, mapped_column(sa.Text)]

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class SessionRow(Base):
    __tablename__ = "session"

    id: Mapped[Id] = mapped_column(primary_key=True)
    directory: Mapped[str] = mapped_column(sa.Text)
    workspace_id: Mapped[str | None] = mapped_column(sa.String(128))
    parent_id: Mapped[str | None] = mapped_column(sa.String(128))
    # The host whose workers run the session's tools (None: ``local``); changed only by a move.
    host: Mapped[str | None] = mapped_column(sa.String(128))
    title: Mapped[str] = mapped_column(sa.Text, default="")
    model: Mapped[str | None] = mapped_column(sa.Text)
    agent: Mapped[str | None] = mapped_column(sa.String(128))
    settings: Mapped[str | None] = mapped_column(sa.Text)
    cost: Mapped[float] = mapped_column(sa.Float, default=0.0)  # USD of the priced steps
    # Steps that reported usage, priced and not (a model without a price): ``Spend.cost``.
    steps_priced: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    steps_unpriced: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    tokens_input: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_output: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_reasoning: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_cache_read: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    tokens_cache_write: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    # The last claim epoch ever issued for this session: it survives claim release, so epochs
    # strictly increase across every claim the session ever had.
    claim_epoch: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    # Provider requests made for this session so far (retries count): a scripted model answers
    # request n with its turn n, across worker restarts.
    request_count: Mapped[int] = mapped_column(sa.BigInteger, default=0)
    time_created: Mapped[Millis]
    time_updated: Mapped[Millis]
    time_archived: Mapped[int | None] = mapped_column(sa.BigInteger)

    __table_args__ = (
        sa.Index(None, "directory"),
        sa.Index(None, "workspace_id"),
        sa.Index(None, "parent_id"),
        sa.Index(None, "time_updated", "id"),
    )


class MessageRow(Base):
    __tablename__ = "session_message"

    id: Mapped[Id] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE")
    )
    type: Mapped[str] = mapped_column(sa.String(32))
    seq: Mapped[Seq]
    time_created: Mapped[Millis]
    time_updated: Mapped[Millis]
    data: Mapped[JsonText]

    __table_args__ = (
        sa.UniqueConstraint("session_id", "seq"),
        sa.Index(None, "session_id", "type", "seq"),
        sa.Index(None, "session_id", "time_created", "id"),
        sa.Index(None, "time_created"),
    )


class PartRow(Base):
    """One part of an assistant message, at its position in the message's content.

    An assistant message's own row holds the message without its parts: an event writes the
    part it changed (and the small message row), never the whole message, so a write's cost
    does not grow with the step.
    """

    __tablename__ = "session_part"

    message_id: Mapped[Id] = mapped_column(
        sa.ForeignKey("session_message.id", ondelete="CASCADE"), primary_key=True
    )
    position: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE")
    )
    # A tool part's call id (provider call ids have no length limit), None for other parts.
    call_id: Mapped[str | None] = mapped_column(sa.Text)
    data: Mapped[JsonText]

    __table_args__ = (
        sa.Index(None, "session_id", "message_id", "position"),
        sa.Index(None, "message_id", "call_id"),
    )


class InputRow(Base):
    __tablename__ = "session_input"

    id: Mapped[Id] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE")
    )
    type: Mapped[str] = mapped_column(sa.String(32))
    prompt: Mapped[str | None] = mapped_column(sa.Text)
    delivery: Mapped[str | None] = mapped_column(sa.String(16))
    admitted_seq: Mapped[Seq]
    promoted_seq: Mapped[int | None] = mapped_column(sa.BigInteger)
    time_created: Mapped[Millis]

    __table_args__ = (
        sa.Index(None, "session_id", "promoted_seq", "delivery", "admitted_seq"),
        sa.Index(
            "uq_session_input_pending_compaction",
            "session_id",
            unique=True,
            sqlite_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
            postgresql_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
        ),
        sa.UniqueConstraint("session_id", "admitted_seq"),
        sa.UniqueConstraint("session_id", "promoted_seq"),
    )


class EventSequenceRow(Base):
    __tablename__ = "event_sequence"

    aggregate_id: Mapped[Id] = mapped_column(primary_key=True)
    seq: Mapped[Seq]
    owner_id: Mapped[str | None] = mapped_column(sa.String(256))


class EventRow(Base):
    __tablename__ = "event"

    id: Mapped[Id] = mapped_column(primary_key=True)
    # No foreign key to event_sequence: every append writes its sequence row first, in the
    # same transaction, and a per-row key check would cost every append a lookup.
    aggregate_id: Mapped[str] = mapped_column(sa.String(128))
    seq: Mapped[Seq]
    created: Mapped[Millis]
    type: Mapped[str] = mapped_column(sa.String(128))
    data: Mapped[JsonText]
    # The claim that was live when the event committed (NULL for unfenced writes).
    execution_id: Mapped[str | None] = mapped_column(sa.String(128))
    epoch: Mapped[int | None] = mapped_column(sa.BigInteger)

    __table_args__ = (
        sa.UniqueConstraint("aggregate_id", "seq"),
        sa.Index(None, "aggregate_id", "type", "seq"),
    )


class ExecutionRow(Base):
    """The claim: which execution (busy period) of which workflow run owns a session."""

    __tablename__ = "session_execution"

    id: Mapped[Id] = mapped_column(primary_key=True)
    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE"), unique=True
    )
    owner_id: Mapped[str] = mapped_column(sa.String(512))
    epoch: Mapped[int] = mapped_column(sa.BigInteger)
    phase: Mapped[str] = mapped_column(sa.String(16), default="ready")
    assistant_message_id: Mapped[str | None] = mapped_column(sa.String(128))
    step_attempt: Mapped[int] = mapped_column(sa.Integer, default=0)
    time_created: Mapped[Millis]
    expires_at: Mapped[Millis]

    __table_args__ = (
        sa.CheckConstraint("phase IN ('ready', 'unknown', 'continue')", name="phase"),
    )


class RecoveryRow(Base):
    """A dead execution whose session must be recovered by the next drain."""

    __tablename__ = "session_recovery"

    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE"), primary_key=True
    )
    execution_id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    phase: Mapped[str] = mapped_column(sa.String(16))
    continuation_message_id: Mapped[str | None] = mapped_column(sa.String(128))
    wake_pending: Mapped[bool] = mapped_column(sa.Boolean, default=True)
    recovery_error: Mapped[str | None] = mapped_column(sa.Text)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    time_created: Mapped[Millis]

    __table_args__ = (sa.Index(None, "wake_pending", "time_created", "execution_id"),)


class ToolRunRow(Base):
    """The latest attempt of ``run_tool`` that took a call: the fence of the call's writes.

    Written before the tool runs, so it also tells a retried attempt whether an earlier one
    may have started the tool (``store/tool_runs.py``).
    """

    __tablename__ = "session_tool_run"

    session_id: Mapped[str] = mapped_column(
        sa.String(128), sa.ForeignKey("session.id", ondelete="CASCADE"), primary_key=True
    )
    assistant_message_id: Mapped[Id] = mapped_column(primary_key=True)
    # Provider call ids have no length limit.
    call_id: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    attempt: Mapped[int] = mapped_column(sa.Integer)
    time_created: Mapped[Millis]
    # The workflow run whose attempt took it: a reset run re-issues an attempt of the same
    # number, which must not take the call as if it were its own retry.
    owner_id: Mapped[str | None] = mapped_column(sa.String(256))


class HostLeaseRow(Base):
    """One worker's lease on a host: it serves that host's tools while ``last_seen`` is within
    the lease (``store/hosts.py``). A host is live while any of its workers' leases is."""

    __tablename__ = "host_lease"

    host: Mapped[Id] = mapped_column(primary_key=True)
    worker: Mapped[str] = mapped_column(sa.String(512), primary_key=True)
    task_queue: Mapped[str] = mapped_column(sa.Text)
    version: Mapped[str] = mapped_column(sa.String(64))
    tools: Mapped[JsonText]  # the tools it offers: name, description, schema, retry-safety
    started_at: Mapped[Millis]
    last_seen: Mapped[Millis]


class ProviderCapacityRow(Base):
    """One provider key's shared capacity (``store/governor.py``): the current minute's
    requests and tokens, and until when a rate-limit answer closed the key for everyone."""

    __tablename__ = "provider_capacity"

    key: Mapped[str] = mapped_column(sa.String(256), primary_key=True)
    window_start: Mapped[Millis]
    requests: Mapped[int] = mapped_column(sa.Integer)
    tokens: Mapped[int] = mapped_column(sa.BigInteger)
    closed_until: Mapped[Millis]


class ProviderStreamRow(Base):
    """A request of ``holder`` (a session: one turn at a time) streaming on a key now."""

    __tablename__ = "provider_stream"

    key: Mapped[str] = mapped_column(sa.String(256), primary_key=True)
    holder: Mapped[Id] = mapped_column(primary_key=True)
    tokens: Mapped[int] = mapped_column(sa.BigInteger)  # what it took of the minute's tokens
    window_start: Mapped[Millis]  # the minute it took them from
    expires_at: Mapped[Millis]  # a holder whose worker died frees its slot by then


class ProviderWaiterRow(Base):
    """A session waiting for a key's capacity, served in order of ``arrived``."""

    __tablename__ = "provider_waiter"

    key: Mapped[str] = mapped_column(sa.String(256), primary_key=True)
    holder: Mapped[Id] = mapped_column(primary_key=True)
    arrived: Mapped[Millis]
    seen: Mapped[Millis]  # a waiter not seen again soon has given up (interrupted, gone)


class BlobRow(Base):
    """Content the file-change journal kept (``store/blobs.py``), by its digest: shared by
    every session, written once, read by a revert."""

    __tablename__ = "session_blob"

    digest: Mapped[str] = mapped_column(sa.String(80), primary_key=True)
    size: Mapped[int] = mapped_column(sa.BigInteger)
    data: Mapped[bytes] = mapped_column(sa.LargeBinary)
    time_created: Mapped[Millis]
    # When a journal entry last named it (written again: the same content kept once more);
    # pruning removes what was named longest ago first.
    time_named: Mapped[Millis] = mapped_column(server_default="0")

    __table_args__ = (sa.Index(None, "time_named"),)


session_table = cast(sa.Table, SessionRow.__table__)
message_table = cast(sa.Table, MessageRow.__table__)
part_table = cast(sa.Table, PartRow.__table__)
input_table = cast(sa.Table, InputRow.__table__)
sequence_table = cast(sa.Table, EventSequenceRow.__table__)
event_table = cast(sa.Table, EventRow.__table__)
execution_table = cast(sa.Table, ExecutionRow.__table__)
recovery_table = cast(sa.Table, RecoveryRow.__table__)
tool_run_table = cast(sa.Table, ToolRunRow.__table__)
host_lease_table = cast(sa.Table, HostLeaseRow.__table__)
capacity_table = cast(sa.Table, ProviderCapacityRow.__table__)
stream_table = cast(sa.Table, ProviderStreamRow.__table__)
waiter_table = cast(sa.Table, ProviderWaiterRow.__table__)
blob_table = cast(sa.Table, BlobRow.__table__)
