"""Catalogue C11 on SQLite: the filesystem under the store fills up, and is freed again."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessionflow.errors import StoreUnavailableError
from sessionflow.models import events as ev
from store import Store
from store.claims import Claim
from store.events import StoredEvent
from tests.conftest import Target

DISK = "4m"
CHUNK = 32 * 1024


@contextlib.contextmanager
def tiny_disk(where: Path, size: str = DISK) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``where``. Mounting needs root (as in CI and ``make test`` here):
    without it the test fails, saying how to run it, rather than skipping a catalogue case."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.fail(
            f"C11 needs a small tmpfs and could not mount one ({mounted.stderr.decode().strip()});"
            " run the suite as root: sudo make test"
        )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Write a file until the filesystem has no byte left; returns it (delete it to free)."""
    filler = disk / "filler"
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as out:
        while True:
            out.write(b"\0" * 4096)
    return filler


def batch(sid: str, db: Path, *, deltas: bool) -> list[ev.Event]:
    """More bytes than the WAL already holds (it reuses its own space once checkpointed)."""
    wal = db.with_name(db.name + "-wal")
    n = (wal.stat().st_size if wal.exists() else 0) // CHUNK + 8
    if deltas:
        return [
            ev.TextDelta(session_id=sid, assistant_message_id="msg_a", ordinal=0, delta="x" * CHUNK)
            for _ in range(n)
        ]
    return [ev.Synthetic(session_id=sid, text="y" * CHUNK) for _ in range(n)]


async def _seqs(store: Store, sid: str) -> list[int]:
    return [e.seq async for e in store.events.log(sid) if isinstance(e, StoredEvent)]


@pytest.mark.parametrize("deltas", [True, False], ids=["hot-path", "fenced"])
async def test_a_full_disk_refuses_a_batch_whole_and_loudly_then_takes_it_once_freed(
    tmp_path: Path, deltas: bool
) -> None:
    """C11: the SQLite store's filesystem fills up (a tmpfs). A batch appended under a live
    claim (token deltas on the hot path, or events with projections on the fenced path) fails
    with ``StoreUnavailableError`` naming the full disk, and nothing of it is committed; once
    space is freed the same batch goes in whole, the seq gap-free."""
    with tiny_disk(tmp_path / "disk") as disk:
        db = disk / "sessionflow.db"
        store = await Target(f"sqlite+aiosqlite:///{db}").open()
        try:
            sid = (await store.sessions.create("/work")).id
            claim: Claim = await store.claims.acquire(sid, "exec_full", "owner_full")
            before = await _seqs(store, sid)
            events = batch(sid, db, deltas=deltas)
            filler = fill(disk)
            with pytest.raises(StoreUnavailableError, match="full"):
                await store.append(claim, events, step_attempt=1)
            assert await _seqs(store, sid) == before, "a partial batch was committed"
            filler.unlink()
            stored = await store.append(claim, events, step_attempt=1)
            after = await _seqs(store, sid)
        finally:
            await store.close()
    first = before[-1] + 1
    assert [e.seq for e in stored] == list(range(first, first + len(events)))
    assert after == before + [e.seq for e in stored]
    assert after == list(range(after[0], after[0] + len(after)))
