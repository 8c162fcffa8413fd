"""Test-only event definitions and small helpers for the store suite."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import sqlalchemy as sa

from sessionflow.errors import SessionflowError
from sessionflow.models.events import Event, SessionEventBase
from store import Store


class Probe(SessionEventBase):
    type: Literal["test.sync"] = "test.sync"
    value: int = 0


class ProbeV2(SessionEventBase):
    version: ClassVar[int] = 2
    type: Literal["test.sync"] = "test.sync"
    value: int = 0
    label: str = ""


class Keyed(Event):
    """An event whose aggregate is named by a custom field."""

    aggregate_field: ClassVar[str] = "key"
    type: Literal["test.keyed"] = "test.keyed"
    key: str
    text: str = ""


async def rows(store: Store, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    async with store.db.read() as conn:
        return [tuple(row) for row in (await conn.execute(sa.text(sql), params)).all()]


async def count(store: Store, table: str, where: str = "1=1", **params: Any) -> int:
    result = await rows(store, f"SELECT count(*) FROM {table} WHERE {where}", **params)
    return int(result[0][0])


async def until_waiting_for(store: Store, pid: int) -> None:
    """PostgreSQL: wait until some backend waits for a lock that backend ``pid`` holds."""
    query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    while True:
        async with store.db.read() as conn:
            if (await conn.execute(query, {"pid": pid})).scalar_one() > 0:
                return
        await asyncio.sleep(0.01)


async def writer_begun(store: Store) -> asyncio.Event:
    """SQLite: set once ``store``'s pooled writer (the connection a write falls back to when
    another process holds the lock) begins a ``BEGIN IMMEDIATE`` (see ``tracer``)."""
    async with store.db.write_engine.connect() as conn:
        driver = (await conn.get_raw_connection()).driver_connection
        assert driver is not None
        begun, trace = tracer("BEGIN IMMEDIATE")
        await driver.set_trace_callback(trace)  # in the connection's own thread
        return begun


def tracer(statement: str) -> tuple[asyncio.Event, Callable[[str], None]]:
    """SQLite: a trace callback for a connection (``set_trace_callback``, from any thread)
    and an event of the running loop it sets once the connection begins running
    ``statement``. SQLite's trace hook fires as a statement starts, before it takes any
    lock: a latched ``BEGIN IMMEDIATE`` waits for the write lock from then on, until it
    gets it."""
    loop = asyncio.get_running_loop()
    begun = asyncio.Event()

    def trace(sql: str) -> None:
        if sql.strip().upper() == statement:
            loop.call_soon_threadsafe(begun.set)

    return begun, trace


async def backend_pid(tx: Any) -> int:
    """PostgreSQL: the backend of the transaction ``tx``."""
    return int((await tx.conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one())


async def appends_with_rollbacks(stores: list[Store], attempts: int) -> int:
    """``attempts`` appends to one aggregate (``ses_gapless``) from ``stores`` at once, about
    30 % of their transactions aborted after the insert; checks the committed seqs are exactly
    0 .. committed - 1 (catalogue S3) and returns how many committed."""

    async def append(store: Store, rng: random.Random) -> int:
        done = 0
        for value in range(attempts // len(stores)):
            try:
                async with store.db.write() as tx:
                    await store.events.publish(Probe(session_id="ses_gapless", value=value), tx=tx)
                    if rng.random() < 0.3:
                        raise SessionflowError("abort this transaction")
                done += 1
            except SessionflowError:
                pass
        return done

    counts = await asyncio.gather(*(append(s, random.Random(i)) for i, s in enumerate(stores)))
    committed = sum(counts)
    seqs = await rows(
        stores[0], "SELECT seq FROM event WHERE aggregate_id = 'ses_gapless' ORDER BY seq"
    )
    assert [s[0] for s in seqs] == list(range(committed))
    return committed


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """The statements sent through the store's PostgreSQL pool meanwhile (each a round trip).
    On SQLite it stays empty: the inline connection runs driver SQL beside the engine."""
    sent: list[str] = []
    engine = store.db.write_engine.sync_engine

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


@contextmanager
def round_trips() -> Iterator[list[str]]:
    """Every round trip to PostgreSQL meanwhile, through SQLAlchemy's pool and the hot path's
    own connections alike (as ``bench/counting.py`` counts them): a statement sent, the BEGIN
    psycopg sends before the first statement of a transaction, and a COMMIT or ROLLBACK that
    reaches the server. The doorbells (NOTIFY, LISTEN) are left out. Empty on SQLite."""
    import psycopg
    from psycopg.pq import TransactionStatus

    sent: list[str] = []
    cursor, connection = psycopg.AsyncCursor, psycopg.AsyncConnection
    execute, executemany = cursor.execute, cursor.executemany
    commit, rollback = connection.commit, connection.rollback

    def record(conn: Any, query: Any) -> None:
        text = " ".join(str(query).split())
        if "pg_notify" in text or text.startswith("LISTEN"):
            return
        idle = conn.info.transaction_status == TransactionStatus.IDLE
        if idle and not conn.autocommit and conn._pipeline is None:
            sent.append("BEGIN")
        sent.append(text)

    async def recorded_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        record(self.connection, query)
        return await execute(self, query, *args, **kwargs)

    async def recorded_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        record(self.connection, query)
        return await executemany(self, query, *args, **kwargs)

    def ending(original: Any, name: str) -> Any:
        async def ended(self: Any) -> Any:
            if self.info.transaction_status != TransactionStatus.IDLE:
                sent.append(name)
            return await original(self)

        return ended

    cursor.execute = recorded_execute  # type: ignore[method-assign]
    cursor.executemany = recorded_executemany  # type: ignore[method-assign]
    connection.commit = ending(commit, "COMMIT")  # type: ignore[method-assign]
    connection.rollback = ending(rollback, "ROLLBACK")  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        cursor.execute, cursor.executemany = execute, executemany  # type: ignore[method-assign]
        connection.commit, connection.rollback = commit, rollback  # type: ignore[method-assign]


async def expire_claim(store: Store, session_id: str) -> None:
    """Move the claim's expiry an hour behind the database clock, as waiting out the lease
    would: the claim's own renewals are then refused, whatever the machine's load."""
    async with store.db.write() as tx:
        await tx.conn.execute(
            sa.text(
                "UPDATE session_execution SET expires_at = expires_at - 3600000"
                " WHERE session_id = :sid"
            ),
            {"sid": session_id},
        )
