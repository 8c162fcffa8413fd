"""Catalogue S11: several processes on one embedded SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionflow.models import events as ev
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.procs import context as procs_context
from tests.store.procs import spawn, sqlite_reader, sqlite_worker

ROUNDS = 30
WAL_LIMIT = 64 * 1024 * 1024


@pytest.mark.fault
async def test_two_worker_processes_and_a_reader_share_one_sqlite_file(tmp_path: Path) -> None:
    """S11: two worker processes append (hot path and fenced path, 30 rounds each, about
    5 MB in all) while a third process reads their logs, all on one SQLite file. No process
    meets SQLITE_BUSY (any error fails its exit code); every batch is stored once, seq
    gap-free; the WAL stays under 64 MB (checkpoints keep up); and the store's connections run
    WAL with ``synchronous=FULL`` (2), as ``store.db`` documents: every acknowledged commit
    survives power loss."""
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
        wal = db.with_name(db.name + "-wal")
        assert wal.stat().st_size < WAL_LIMIT
        async with store.db.read() as conn:
            mode = (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar()
            synchronous = (await conn.exec_driver_sql("PRAGMA synchronous")).scalar()
        assert (mode, synchronous) == ("wal", 2)
    finally:
        await store.close()
