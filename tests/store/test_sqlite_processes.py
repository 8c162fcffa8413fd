"""Catalogue S11: several processes on one embedded SQLite store."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sessionflow.models import events as ev
from store.db import SQLITE_WAL_LIMIT_BYTES
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.procs import (
    MB,
    spawn,
    sqlite_bulk_writer,
    sqlite_holding_reader,
    sqlite_reader,
    sqlite_worker,
)
from tests.store.procs import context as procs_context

ROUNDS = 30
HELD_MB = 100  # per writer: 200 MB past the held reader
AFTER = 3


@pytest.mark.fault
async def test_two_worker_processes_and_a_reader_share_one_sqlite_file(tmp_path: Path) -> None:
    """S11: two worker processes append (hot path and fenced path, 30 rounds each, about
    5 MB in all) while a third process reads their logs, all on one SQLite file. No process
    meets SQLITE_BUSY (any error fails its exit code); every batch is stored once, seq
    gap-free; and the store's connections run WAL with ``synchronous=FULL`` (2), as
    ``store.db`` documents: every acknowledged commit survives power loss. (The WAL's bound,
    which 5 MB of writes could never test, is the next test's.)"""
    db = tmp_path / "sessionflow.db"
    target = Target(f"sqlite+aiosqlite:///{db}")
    store = await target.open()
    try:
        sids = [(await store.sessions.create("/work")).id for _ in range(2)]
        ctx = procs_context()
        start, stop = ctx.Barrier(3), ctx.Event()
        reader = spawn(sqlite_reader, target, sids, start, stop)
        workers = [
            spawn(sqlite_worker, target, sid, i, ROUNDS, start) for i, sid in enumerate(sids)
        ]
        for worker in workers:
            worker.join(120)
        stop.set()
        reader.join(60)
        assert [w.exitcode for w in workers] == [0, 0], "a worker process failed"
        assert reader.exitcode == 0, "the reader process failed"
        for sid in sids:
            log = [e async for e in store.events.log(sid) if isinstance(e, StoredEvent)]
            seqs = [e.seq for e in log]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            notes = [e.data.text for e in log if isinstance(e.data, ev.Synthetic)]
            assert notes == [f"round {r}" for r in range(ROUNDS)]
            assert sum(isinstance(e.data, ev.TextDelta) for e in log) == 20 * ROUNDS
        async with store.db.read() as conn:
            mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
            synchronous = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
        assert (mode, synchronous) == ("wal", 2)
    finally:
        await store.close()


@pytest.mark.fault
async def test_200_mb_past_a_held_reader_grows_the_wal_and_its_release_truncates_it(
    tmp_path: Path,
) -> None:
    """S11 at scale: two writer processes append 100 MB each (1 MB batches of token deltas)
    while a third process holds a read transaction open from before their first write, then
    lets go. While it holds, no checkpoint can pass its snapshot, so the WAL grows past the
    200 MB (which shows the reader did hold it). Once it let go, the writers' next commits
    checkpoint and reset the log, and the file is truncated back to the store's limit. No
    writer meets SQLITE_BUSY (any error fails its exit code), and every batch is stored once."""
    db = tmp_path / "sessionflow.db"
    wal = db.with_name(db.name + "-wal")
    target = Target(f"sqlite+aiosqlite:///{db}")
    store = await target.open()
    try:
        sids = [(await store.sessions.create("/work")).id for _ in range(2)]
        ctx = procs_context()
        start, written, released = ctx.Barrier(3), ctx.Barrier(3), ctx.Event()
        reader = spawn(sqlite_holding_reader, target, sids[0], (start, released))
        gates = (start, written, released)
        writers = [
            spawn(sqlite_bulk_writer, target, sid, i, HELD_MB, AFTER, gates)
            for i, sid in enumerate(sids)
        ]
        try:
            await asyncio.to_thread(written.wait, 600)
            held = wal.stat().st_size
        finally:
            released.set()
        reader.join(60)
        for writer in writers:
            writer.join(300)
        assert reader.exitcode == 0, "the reader process failed"
        assert [w.exitcode for w in writers] == [0, 0], "a writer process failed"
        assert held > 2 * HELD_MB * MB, held
        assert wal.stat().st_size <= SQLITE_WAL_LIMIT_BYTES, wal.stat().st_size
        for sid in sids:
            log = [e async for e in store.events.log(sid) if isinstance(e, StoredEvent)]
            deltas = [e.data for e in log if isinstance(e.data, ev.TextDelta)]
            assert len(deltas) == 16 * (HELD_MB + AFTER)
            batches = [int(d.delta[:8]) for d in deltas[::16]]
            assert batches == list(range(HELD_MB + AFTER))
    finally:
        await store.close()
