"""Catalogue C4 through a drain: the session's PostgreSQL database goes down and comes back, or
its whole server restarts, is stopped or is killed, while a turn streams and while a tool runs.
docs/reliability.md lists the case."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url
from temporalio.testing import WorkflowEnvironment

from store.events import StoredEvent
from tests.conftest import Target
from tests.invariants import TOOL_TERMINALS, assert_clean, final_log
from tests.pgcluster import Cluster
from tests.store.conftest import allow_connections, libpq, refuse_connections
from tests.store.test_disk_full import fill, tiny_disk
from tests.workflows.harness import Harness, call, follow_busy_period, harness

OUTAGE_S = 3  # how long each spell lasts once the drain has run into it
OUTAGE_RETRY = "The database is unavailable, retrying"  # activities.runtime.through_outages


@pytest.mark.fault
async def test_a_drain_rides_out_its_database_going_down_mid_stream_and_mid_tool(
    temporal_env: WorkflowEnvironment,
    postgres_url: str,
    own_database: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C4: the session's PostgreSQL database goes down (new connections refused, every backend
    terminated, as a restart does to its clients) and comes back, twice: while the model
    streams, and while a tool runs. Each spell lasts until the drain has run into it (the
    turn's appends fail; the tool's settlement is refused). The busy period finishes under its
    one claim; every call settles exactly once, the tool that ran through the outage as a
    success; the seqs are gap-free and the checker passes."""
    caplog.set_level(logging.WARNING)
    database = make_url(own_database).database
    assert database is not None
    store = await Target(own_database).open()
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            stream, tool = h.gate_file("stream"), h.gate_file("tool")
            sid = await h.session(
                [{"text": "before "}, {"wait_for_file": stream}, {"text": "after", "chunks": 20}],
                # The turn the database cut off runs again: the script's next turn answers it.
                [
                    {"text": "continuing"},
                    call("slow", "gate", text="ran through the outage", gate=tool),
                    call("quick", "echo", text="quick"),
                ],
                [{"text": "done"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
            try:
                # Mid-stream: the turn's next batch finds the database gone.
                await asyncio.to_thread(refuse_connections, postgres_url, database)
                h.open_gate("stream")
                await h.until(lambda: _turn_failed(h, sid), timeout=30)
                await asyncio.sleep(OUTAGE_S)  # the spell's length: no assertion is timed
                await asyncio.to_thread(allow_connections, postgres_url, database)
                # Mid-tool: the gate tool runs, the database goes, the tool finishes.
                await h.until(lambda: h.gate.active == 1, timeout=60)
                await h.until(lambda: _settled(h, sid, "quick"), timeout=30)
                caplog.clear()
                await asyncio.to_thread(refuse_connections, postgres_url, database)
                h.open_gate("tool")
                await h.until(lambda: h.gate.active == 0, timeout=30)  # it ran: now settle it
                await h.until(lambda: _store_retried(caplog), timeout=30)
                await asyncio.sleep(OUTAGE_S)
            finally:
                await asyncio.to_thread(allow_connections, postgres_url, database)
            await h.client.wait_idle(sid, timeout=90)
            log = await final_log(store, sid)
    finally:
        await store.close()
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1
    assert types[-1] == "session.execution.succeeded", log[-1].data
    assert len({(e.execution_id, e.epoch) for e in log if e.execution_id}) == 1
    settled = [(e.data.call_id, e.data.type) for e in log if e.data.type in TOOL_TERMINALS]
    assert sorted(settled) == [("quick", "session.tool.success"), ("slow", "session.tool.success")]
    assert [e.seq for e in log] == list(range(log[0].seq, log[0].seq + len(log)))
    # The stream the first spell cut off was closed and its turn run again (the tool ran once).
    [cut] = [e.data for e in log if e.data.type == "session.step.failed"]
    assert "database is unavailable" in cut.error.message
    # Issue 32: it says what happened and that the session went on, not "Retry once ...".
    assert cut.error.message.startswith("Step interrupted by a database outage (The database")
    assert cut.error.message.endswith("; continued") and "Retry" not in cut.error.message
    assert h.gate.started == ["ran through the outage"]
    text = "".join(getattr(e.data, "text", "") for e in log if e.data.type == "session.text.ended")
    assert text.startswith("before ") and text.endswith("continuingdone"), text


# How the server goes away: (what is done to it, whether it is down until started again).
RESTARTS = {
    "restart -m fast": (Cluster.restart_fast, False),
    "stop -m immediate": (Cluster.stop_immediate, True),
    "kill -9 postmaster": (Cluster.kill_postmaster, True),
}


@pytest.mark.fault
@pytest.mark.parametrize("how", list(RESTARTS))
async def test_a_drain_rides_out_its_postgres_server_restarting_mid_stream_and_mid_tool(
    how: str,
    temporal_env: WorkflowEnvironment,
    pg_cluster: Cluster,
    cluster_database: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """C4: the whole PostgreSQL server (a throwaway cluster of the test's own) restarts
    (``pg_ctl restart -m fast``), or is stopped (``pg_ctl stop -m immediate``) or killed
    (``kill -9`` of the postmaster) and started again, twice: while the turn's append is in
    flight (its transaction waits on the claim row, which the test holds) and while a tool's
    settlement is. A server that is down stays down until the drain, and a follower on a
    store of its own, have run into it. The busy period succeeds under its one
    claim; each call settles once as a success and the tool ran once; every event the follower
    was given (committed, so acknowledged) is in the final log, which it got exactly once and
    in order; the seqs are gap-free and the checker passes."""
    caplog.set_level(logging.WARNING)
    act, stays_down = RESTARTS[how]
    database = make_url(cluster_database).database
    assert database is not None
    store = await Target(cluster_database).open()
    follower_store = await Target(cluster_database).open()
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            stream, tool = h.gate_file("stream"), h.gate_file("tool")
            sid = await h.session(
                [{"text": "before "}, {"wait_for_file": stream}, {"text": "after", "chunks": 20}],
                [
                    {"text": "continuing"},
                    call("slow", "gate", text="ran through the restart", gate=tool),
                    call("quick", "echo", text="quick"),
                ],
                [{"text": "done"}],
            )
            followed: list[StoredEvent] = []
            follower = asyncio.create_task(follow_busy_period(follower_store, sid, followed))
            await h.client.prompt(sid, "Go")
            await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)

            async def outage(gate: str, then: object) -> None:
                """The server goes away while a write (let go by ``gate``) waits on the claim
                row inside its transaction; a stopped one starts again once ``then`` holds."""
                async with _claim_row_held(pg_cluster, database, sid):
                    h.open_gate(gate)
                    await h.until(lambda: _lock_waiters(pg_cluster, database), timeout=30)
                    await asyncio.to_thread(act, pg_cluster)
                    if stays_down:
                        await h.until(then, timeout=60)
                        await h.until(lambda: follower.done() or _follower_retried(caplog))
                        await asyncio.to_thread(pg_cluster.start)

            await outage("stream", lambda: _turn_failed(h, sid))
            await h.until(lambda: h.gate.active == 1, timeout=60)
            await h.until(lambda: _settled(h, sid, "quick"), timeout=30)
            caplog.clear()
            await outage("tool", lambda: _store_retried(caplog))
            await h.client.wait_idle(sid, timeout=90)
            log = await final_log(store, sid)
            await asyncio.wait([follower], timeout=30)
            assert follower.done(), "the follower never reached the busy period's end"
            follower.result()
    finally:
        if not pg_cluster.running():
            pg_cluster.start()
        await follower_store.close()
        await store.close()
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1
    assert types[-1] == "session.execution.succeeded", log[-1].data
    assert len({(e.execution_id, e.epoch) for e in log if e.execution_id}) == 1
    settled = [(e.data.call_id, e.data.type) for e in log if e.data.type in TOOL_TERMINALS]
    assert sorted(settled) == [("quick", "session.tool.success"), ("slow", "session.tool.success")]
    assert h.gate.started == ["ran through the restart"]
    assert [e.seq for e in log] == list(range(log[0].seq, log[0].seq + len(log)))
    assert [(e.seq, e.id) for e in followed] == [(e.seq, e.id) for e in log]
    # A turn cut off mid-append is closed once, naming the outage, and asked again.
    cut = [e.data.error.message for e in log if e.data.type == "session.step.failed"]
    assert len(cut) <= 1 and all("database is unavailable" in m for m in cut), cut
    text = "".join(getattr(e.data, "text", "") for e in log if e.data.type == "session.text.ended")
    assert text.startswith("before ") and text.endswith("continuingdone"), text


@contextlib.asynccontextmanager
async def _claim_row_held(cluster: Cluster, database: str, sid: str) -> AsyncIterator[None]:
    """The session's claim row locked by the test, so that the drain's next write waits on it
    inside its transaction: the server then goes away mid-write.

    The lock is held by a prepared transaction, which outlives the server's restart, and is
    let go (rolled back) on leaving, the server up again. Held by a session's transaction, it
    went with that session's backend, and a fast shutdown that ended the holder before the
    waiter let the waiting write take the row and commit: the write then never met the outage
    the test is about.
    """
    name = f"hold-{uuid.uuid4().hex}"
    async with await psycopg.AsyncConnection.connect(cluster.libpq(database)) as conn:
        await conn.execute(
            "SELECT 1 FROM session_execution WHERE session_id = %s FOR UPDATE", [sid]
        )
        await conn.execute(f"PREPARE TRANSACTION '{name}'")
    try:
        yield
    finally:
        async with await psycopg.AsyncConnection.connect(
            cluster.libpq(database), autocommit=True
        ) as conn:
            await conn.execute(f"ROLLBACK PREPARED '{name}'")


def _lock_waiters(cluster: Cluster, database: str) -> bool:
    with psycopg.connect(cluster.libpq(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            [database],
        ).fetchone()
    return bool(row and row[0])


async def _has(h: Harness, sid: str, kind: str) -> bool:
    return kind in await h.types(sid, deltas=True)


async def _settled(h: Harness, sid: str, call_id: str) -> bool:
    events = await h.events(sid)
    return any(e.type in TOOL_TERMINALS and e.data.get("call_id") == call_id for e in events)


async def _turn_failed(h: Harness, sid: str) -> bool:
    """Whether a turn activity failed (its appends ran into the outage): Temporal knows,
    the database being down."""
    history = await h.client._handle(sid).fetch_history()
    return any(e.HasField("activity_task_failed_event_attributes") for e in history.events)


def _follower_retried(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the follower's read found the database down and is trying again."""
    return any(r.getMessage().startswith("Following:") for r in caplog.records)


def _store_retried(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the tool's settlement was refused by the outage and is being retried."""
    return any(r.getMessage().startswith(OUTAGE_RETRY) for r in caplog.records)


def _read_only(admin_url: str, database: str, on: bool) -> None:
    """``ALTER DATABASE … SET default_transaction_read_only``, then every backend of the
    database terminated so that the store's new connections take the setting."""
    with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
        value = "on" if on else "off"
        conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = {value}')
        backends = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        pids = [row[0] for row in conn.execute(backends, [database]).fetchall()]
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
        # Until each has exited: its client's socket then reads as closed, and the pool opens
        # a fresh connection instead of handing out one the server is still closing.
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone():
            time.sleep(0.01)


@pytest.mark.fault
async def test_a_drain_pauses_through_a_read_only_spell_and_resumes(
    temporal_env: WorkflowEnvironment, postgres_url: str, own_database: str, tmp_path: Path
) -> None:
    """C11: the session's PostgreSQL database turns read-only (``ALTER DATABASE … SET
    default_transaction_read_only=on``) while the model streams, and writable again once the
    drain has run into it (its turn activity failed, refused). The busy period finishes under
    its one claim: the cut-off turn is closed with the database's reason and run again, and
    nothing of a refused batch is half there (seq gap-free; the checker passes)."""
    database = make_url(own_database).database
    assert database is not None
    store = await Target(own_database).open()
    try:
        async with harness(temporal_env.client, store, tmp_path) as h:
            stream = h.gate_file("stream")
            sid = await h.session(
                [{"text": "before "}, {"wait_for_file": stream}, {"text": "after", "chunks": 20}],
                [{"text": "continued"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
            try:
                await asyncio.to_thread(_read_only, postgres_url, database, True)
                h.open_gate("stream")
                await h.until(lambda: _turn_failed(h, sid), timeout=30)
            finally:
                await asyncio.to_thread(_read_only, postgres_url, database, False)
            await h.client.wait_idle(sid, timeout=90)
            log = await final_log(store, sid)
    finally:
        await store.close()
    _cut_once_then_succeeded(log, "read-only")


@pytest.mark.fault
async def test_a_drain_on_a_full_disk_fails_its_turn_loudly_and_finishes_once_freed(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """C11 through a drain: the filesystem under a SQLite store (a 32 MB tmpfs) fills up while
    the model streams 2 MB of text, and is freed once the drain has run into it (its turn
    activity failed, "database or disk is full"). The busy period finishes under its one claim:
    the cut-off turn is closed naming the full disk and run again; nothing of a refused batch
    is half there (seq gap-free; the checker passes)."""
    with tiny_disk(tmp_path / "disk", "32m") as disk:
        store = await Target(f"sqlite+aiosqlite:///{disk / 'sessionflow.db'}").open()
        try:
            async with harness(temporal_env.client, store, tmp_path) as h:
                stream = h.gate_file("stream")
                sid = await h.session(
                    [
                        {"text": "before "},
                        {"wait_for_file": stream},
                        {"text": "x" * 2_000_000, "chunks": 200},
                    ],
                    [{"text": "continued"}],
                )
                await h.client.prompt(sid, "Go")
                await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
                filler = fill(disk)
                try:
                    h.open_gate("stream")
                    await h.until(lambda: _turn_failed(h, sid), timeout=30)
                finally:
                    filler.unlink()
                await h.client.wait_idle(sid, timeout=90)
                log = await final_log(store, sid)
        finally:
            await store.close()
    _cut_once_then_succeeded(log, "full")


def _cut_once_then_succeeded(log: list[StoredEvent], reason: str) -> None:
    """The busy period finished under its one claim after one turn was cut off, the store
    naming ``reason``; the seq is gap-free and the checker passes."""
    assert_clean(log)
    types = [e.data.type for e in log]
    assert types.count("session.execution.started") == 1
    assert types[-1] == "session.execution.succeeded", log[-1].data
    assert [e.seq for e in log] == list(range(log[0].seq, log[0].seq + len(log)))
    [cut] = [e.data for e in log if e.data.type == "session.step.failed"]
    assert reason in cut.error.message, cut.error.message
