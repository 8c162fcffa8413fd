"""message parts: an assistant message's parts in rows of their own

Revision ID: 0003
Revises: 0002

An event used to load, re-serialize and rewrite its whole assistant message; with the parts in
rows of their own it writes only the part it changed. Existing assistant messages move their
parts into the new table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store import codec

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_part",
        sa.Column("message_id", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=True),
        sa.Column("data", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["session_message.id"],
            name=op.f("fk_session_part_message_id_session_message"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_part_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", "position", name=op.f("pk_session_part")),
    )
    with op.batch_alter_table("session_part", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_session_part_session_id_message_id_position"),
            ["session_id", "message_id", "position"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_session_part_message_id_call_id"),
            ["message_id", "call_id"],
            unique=False,
        )
    _move_parts()


def _move_parts() -> None:
    """Every stored assistant message's parts into ``session_part``, its row without them."""
    bind = op.get_bind()
    message = sa.table(
        "session_message",
        sa.column("id"),
        sa.column("session_id"),
        sa.column("type"),
        sa.column("data"),
    )
    part = sa.table(
        "session_part",
        sa.column("message_id"),
        sa.column("position"),
        sa.column("session_id"),
        sa.column("call_id"),
        sa.column("data"),
    )
    rows = bind.execute(
        sa.select(message.c.id, message.c.session_id, message.c.data).where(
            message.c.type == "assistant"
        )
    ).all()
    for message_id, session_id, data in rows:
        body = codec.loads(data)
        parts = body.pop("content", [])
        if parts:
            values = [
                {
                    "message_id": message_id,
                    "position": position,
                    "session_id": session_id,
                    "call_id": item.get("call_id") if item.get("type") == "tool" else None,
                    "data": codec.dumps(item),
                }
                for position, item in enumerate(parts)
            ]
            bind.execute(part.insert(), values)
        body["content"] = []
        statement = message.update().where(message.c.id == message_id)
        bind.execute(statement.values(data=codec.dumps(body)))


def downgrade() -> None:
    op.drop_table("session_part")
