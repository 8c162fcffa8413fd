"""run owners: which workflow run took a tool call (a reset run re-issues the same attempt)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session_tool_run", schema=None) as batch_op:
        batch_op.add_column(sa.Column("owner_id", sa.String(length=256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("session_tool_run", schema=None) as batch_op:
        batch_op.drop_column("owner_id")
