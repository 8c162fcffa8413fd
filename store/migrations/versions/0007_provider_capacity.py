"""provider capacity: the rate governor's shared state per provider key

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "provider_capacity",
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("closed_until", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_provider_capacity")),
    )
    op.create_table(
        "provider_stream",
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", "holder", name=op.f("pk_provider_stream")),
    )
    op.create_table(
        "provider_waiter",
        sa.Column("key", sa.String(length=256), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=False),
        sa.Column("arrived", sa.BigInteger(), nullable=False),
        sa.Column("seen", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", "holder", name=op.f("pk_provider_waiter")),
    )


def downgrade() -> None:
    op.drop_table("provider_waiter")
    op.drop_table("provider_stream")
    op.drop_table("provider_capacity")
