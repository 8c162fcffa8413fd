"""initial schema

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "event_sequence",
        sa.Column("aggregate_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("owner_id", sa.String(length=256), nullable=True),
        sa.PrimaryKeyConstraint("aggregate_id", name=op.f("pk_event_sequence")),
    )
    op.create_table(
        "session",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("directory", sa.Text(), nullable=False),
        sa.Column("workspace_id", sa.String(length=128), nullable=True),
        sa.Column("parent_id", sa.String(length=128), nullable=True),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("agent", sa.String(length=128), nullable=True),
        sa.Column("settings", sa.Text(), nullable=True),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("tokens_input", sa.BigInteger(), nullable=False),
        sa.Column("tokens_output", sa.BigInteger(), nullable=False),
        sa.Column("tokens_reasoning", sa.BigInteger(), nullable=False),
        sa.Column("tokens_cache_read", sa.BigInteger(), nullable=False),
        sa.Column("tokens_cache_write", sa.BigInteger(), nullable=False),
        sa.Column("claim_epoch", sa.BigInteger(), nullable=False),
        sa.Column("request_count", sa.BigInteger(), nullable=False),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.Column("time_updated", sa.BigInteger(), nullable=False),
        sa.Column("time_archived", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session")),
    )
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_session_directory"), ["directory"], unique=False)
        batch_op.create_index(batch_op.f("ix_session_parent_id"), ["parent_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_session_time_updated_id"), ["time_updated", "id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_session_workspace_id"), ["workspace_id"], unique=False)

    op.create_table(
        "event",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("aggregate_id", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("created", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(length=128), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("execution_id", sa.String(length=128), nullable=True),
        sa.Column("epoch", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event")),
        sa.UniqueConstraint("aggregate_id", "seq", name=op.f("uq_event_aggregate_id_seq")),
    )
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_event_aggregate_id_type_seq"),
            ["aggregate_id", "type", "seq"],
            unique=False,
        )

    op.create_table(
        "session_execution",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("owner_id", sa.String(length=512), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("assistant_message_id", sa.String(length=128), nullable=True),
        sa.Column("step_attempt", sa.Integer(), nullable=False),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("phase IN ('ready', 'unknown', 'continue')", name="phase"),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_execution_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_execution")),
        sa.UniqueConstraint("session_id", name=op.f("uq_session_execution_session_id")),
    )
    op.create_table(
        "session_input",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("delivery", sa.String(length=16), nullable=True),
        sa.Column("admitted_seq", sa.BigInteger(), nullable=False),
        sa.Column("promoted_seq", sa.BigInteger(), nullable=True),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_input_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_input")),
        sa.UniqueConstraint(
            "session_id", "admitted_seq", name=op.f("uq_session_input_session_id_admitted_seq")
        ),
        sa.UniqueConstraint(
            "session_id", "promoted_seq", name=op.f("uq_session_input_session_id_promoted_seq")
        ),
    )
    with op.batch_alter_table("session_input", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_session_input_session_id_promoted_seq_delivery_admitted_seq"),
            ["session_id", "promoted_seq", "delivery", "admitted_seq"],
            unique=False,
        )
        batch_op.create_index(
            "uq_session_input_pending_compaction",
            ["session_id"],
            unique=True,
            sqlite_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
            postgresql_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
        )

    op.create_table(
        "session_message",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.Column("time_updated", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_message_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_session_message")),
        sa.UniqueConstraint("session_id", "seq", name=op.f("uq_session_message_session_id_seq")),
    )
    with op.batch_alter_table("session_message", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_session_message_session_id_time_created_id"),
            ["session_id", "time_created", "id"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_session_message_session_id_type_seq"),
            ["session_id", "type", "seq"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_session_message_time_created"), ["time_created"], unique=False
        )

    op.create_table(
        "session_recovery",
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("execution_id", sa.String(length=128), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("continuation_message_id", sa.String(length=128), nullable=True),
        sa.Column("wake_pending", sa.Boolean(), nullable=False),
        sa.Column("recovery_error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_recovery_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_id", "execution_id", name=op.f("pk_session_recovery")),
    )
    with op.batch_alter_table("session_recovery", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_session_recovery_wake_pending_time_created_execution_id"),
            ["wake_pending", "time_created", "execution_id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("session_recovery", schema=None) as batch_op:
        batch_op.drop_index(
            batch_op.f("ix_session_recovery_wake_pending_time_created_execution_id")
        )

    op.drop_table("session_recovery")
    with op.batch_alter_table("session_message", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_session_message_time_created"))
        batch_op.drop_index(batch_op.f("ix_session_message_session_id_type_seq"))
        batch_op.drop_index(batch_op.f("ix_session_message_session_id_time_created_id"))

    op.drop_table("session_message")
    with op.batch_alter_table("session_input", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_session_input_pending_compaction",
            sqlite_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
            postgresql_where=sa.text("type = 'compaction' AND promoted_seq IS NULL"),
        )
        batch_op.drop_index(
            batch_op.f("ix_session_input_session_id_promoted_seq_delivery_admitted_seq")
        )

    op.drop_table("session_input")
    op.drop_table("session_execution")
    with op.batch_alter_table("event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_event_aggregate_id_type_seq"))

    op.drop_table("event")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_session_workspace_id"))
        batch_op.drop_index(batch_op.f("ix_session_time_updated_id"))
        batch_op.drop_index(batch_op.f("ix_session_parent_id"))
        batch_op.drop_index(batch_op.f("ix_session_directory"))

    op.drop_table("session")
    op.drop_table("event_sequence")
