"""Alembic environment: migrations run on a connection the store hands over (upgrade on open)."""

from __future__ import annotations

from alembic import context

from store.schema import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "sessionflow migrations run when the store opens (store.open_store); "
        "they are not meant to be run from the alembic command line"
    )
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
