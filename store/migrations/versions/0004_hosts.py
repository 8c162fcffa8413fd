"""hosts: a session's host, and the leases of the workers that serve each host's tools

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(sa.Column("host", sa.String(length=128), nullable=True))
    op.create_table(
        "host_lease",
        sa.Column("host", sa.String(length=128), nullable=False),
        sa.Column("worker", sa.String(length=512), nullable=False),
        sa.Column("task_queue", sa.Text(), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("tools", sa.Text(), nullable=False),
        sa.Column("started_at", sa.BigInteger(), nullable=False),
        sa.Column("last_seen", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("host", "worker", name=op.f("pk_host_lease")),
    )


def downgrade() -> None:
    op.drop_table("host_lease")
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("host")
