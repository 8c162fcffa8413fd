"""session blobs: when a journal entry last named each content (pruning goes by it)

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("session_blob") as batch:
        batch.add_column(
            sa.Column("time_named", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.execute("UPDATE session_blob SET time_named = time_created")
    op.create_index(op.f("ix_session_blob_time_named"), "session_blob", ["time_named"])


def downgrade() -> None:
    op.drop_index(op.f("ix_session_blob_time_named"), table_name="session_blob")
    with op.batch_alter_table("session_blob") as batch:
        batch.drop_column("time_named")
