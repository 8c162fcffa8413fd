"""tool runs: the latest attempt of run_tool per call

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_tool_run",
        sa.Column("session_id", sa.String(length=128), nullable=False),
        sa.Column("assistant_message_id", sa.String(length=128), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time_created", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["session.id"],
            name=op.f("fk_session_tool_run_session_id_session"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "session_id", "assistant_message_id", "call_id", name=op.f("pk_session_tool_run")
        ),
    )


def downgrade() -> None:
    op.drop_table("session_tool_run")
