"""``open_store``: one object with the database, event store, claims, inputs and sessions."""

from __future__ import annotations

from dataclasses import dataclass

from sessionflow.settings import Settings
from store import projector
from store.claims import Claims
from store.db import Database
from store.events import EventStore
from store.inputs import Inputs
from store.notify import Notifier
from store.sessions import Sessions


@dataclass
class Store:
    db: Database
    notifier: Notifier
    events: EventStore
    claims: Claims
    inputs: Inputs
    sessions: Sessions

    async def close(self) -> None:
        await self.notifier.close()
        await self.db.dispose()


async def open_store(
    url: str | None = None,
    *,
    settings: Settings | None = None,
    schema: str | None = None,
    migrate: bool = True,
) -> Store:
    """Open (and migrate to head) the store at ``url``, or at ``settings.database_url``."""
    settings = settings or Settings()
    db = Database(url or settings.database_url, schema=schema)
    try:
        if migrate:
            await db.migrate()
    except BaseException:
        await db.dispose()
        raise
    postgres = db.dialect == "postgresql"
    notifier = Notifier(db.psycopg_conninfo if postgres else None)
    poll_ms = settings.poll_interval_ms or (1000 if postgres else 100)
    events = EventStore(
        db, notifier, max_event_bytes=settings.max_event_bytes, poll_interval=poll_ms / 1000
    )
    projector.install(events)
    return Store(
        db=db,
        notifier=notifier,
        events=events,
        claims=Claims(db, lease_ms=settings.lease_ms),
        inputs=Inputs(db, events),
        sessions=Sessions(db, events),
    )
