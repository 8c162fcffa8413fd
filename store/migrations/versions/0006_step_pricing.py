"""step pricing: how many of a session's steps were priced and not (a model without a price)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("steps_priced", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("steps_unpriced", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("session", schema=None) as batch_op:
        batch_op.drop_column("steps_unpriced")
        batch_op.drop_column("steps_priced")
