"""``open_store``: one object with the database, event store, claims, inputs and sessions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry import trace

from sessionflow.models.events import Event
from sessionflow.settings import Settings
from store import projector
from store.claims import Claim, Claims
from store.db import Database, Pools, Stamp, Tx
from store.events import EventStore, StoredEvent
from store.fast import PostgresWriter, SqliteWriter
from store.inputs import Inputs
from store.notify import Notifier
from store.sessions import Sessions
from store.tool_runs import ToolRuns

_tracer = trace.get_tracer("sessionflow.store")


@dataclass
class Store:
    db: Database
    notifier: Notifier
    events: EventStore
    claims: Claims
    inputs: Inputs
    sessions: Sessions
    writer: SqliteWriter | PostgresWriter | None = field(default=None)
    tool_runs: ToolRuns = field(default_factory=ToolRuns)

    async def append(
        self, claim: Claim, events: Sequence[Event], *, step_attempt: int | None = None
    ) -> list[StoredEvent]:
        """Append ``events`` in one fenced transaction under ``claim``.

        Batches of one aggregate's projector-free events (token deltas) take the hot path in
        ``store.fast``; anything else is ``claims.fenced`` + ``events.publish_many``. Both
        refuse with ``ClaimLostError`` (or ``StaleAttemptError``) and write nothing.
        """
        if not events:
            return []
        attributes: dict[str, str | int] = {"session.id": claim.session_id, "events": len(events)}
        with _tracer.start_as_current_span("store.append", attributes=attributes):
            return await self._append(claim, events, step_attempt)

    async def _append(
        self, claim: Claim, events: Sequence[Event], step_attempt: int | None
    ) -> list[StoredEvent]:
        if any(self.events.has_projector(type(e)) for e in events) or (
            len({e.aggregate_id for e in events}) > 1
        ):

            async def publish(tx: Tx) -> list[StoredEvent]:
                return await self.events.publish_many(events, tx=tx)

            return await self.claims.run_fenced(claim, publish, step_attempt=step_attempt)
        rows = self.events.prepare_rows(events, Stamp(claim.execution_id, claim.epoch))
        fence = {
            "sid": claim.session_id,
            "eid": claim.execution_id,
            "owner": claim.owner_id,
            "epoch": claim.epoch,
            "lease": claim.lease_ms,
            "attempt": -1 if step_attempt is None else step_attempt,
        }
        stored: list[StoredEvent] = []

        def announce() -> None:  # runs with the commit, before a cancellation can cut in
            stored.extend(self.events.committed(rows, events))

        if isinstance(self.writer, SqliteWriter):
            async with self.db.serialized():
                appended = await self.writer.append(fence, rows, announce)
        else:
            assert self.writer is not None
            appended = await self.writer.append(fence, rows, announce)
        if not appended:
            raise await self.claims.why_lost(claim, step_attempt)
        return stored

    async def close(self) -> None:
        await self.notifier.close()
        if self.writer is not None:
            await self.writer.close()
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
    pools = Pools(size=settings.db_pool_size, overflow=settings.db_pool_overflow)
    db = Database(
        url or settings.database_url, schema=schema, lease_ms=settings.lease_ms, pools=pools
    )
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
        writer=SqliteWriter(db) if db.dialect == "sqlite" else PostgresWriter(db),
    )
