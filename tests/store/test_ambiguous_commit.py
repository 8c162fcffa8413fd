"""Catalogue C2: an activity's append commits and its answer is lost (``ExecuteAndTimeout``).

The fault is injected at the driver (``tests.faults``): the commit lands, then the caller gets
a lost connection. The store's own retry finds the batch by its ids and returns it as stored.
"""

from __future__ import annotations

import pytest

from sessionflow.errors import StoreUnavailableError
from sessionflow.models import events as ev
from store import Store
from tests.faults import injecting
from tests.store.helpers import rows
from tests.store.test_fast import claimed, deltas


async def _log(store: Store, sid: str) -> list[tuple[int, str, str]]:
    found = await rows(
        store, "SELECT seq, id, type FROM event WHERE aggregate_id = :a ORDER BY seq", a=sid
    )
    return [(int(seq), id, type) for seq, id, type in found]


async def test_a_hot_path_batch_whose_commit_answer_is_lost_is_stored_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C2: a turn's batch of token deltas (the hot path) commits, then its connection fails;
    the append returns the batch with the seqs it was stored at, and nothing is written
    twice (seq gap-free)."""
    with injecting(monkeypatch) as faults:
        ((sid, claim),) = await claimed(store)
        before = len(await _log(store, sid))
        faults.arm(commit_then_fail=1)
        stored = await store.append(claim, deltas(sid, 5), step_attempt=1)
        assert faults.seen == {"commit_then_fail": 1}
    log = await _log(store, sid)
    assert len(log) == before + 5, "a batch was written twice"
    assert [seq for seq, _, _ in log] == list(range(log[0][0], log[0][0] + len(log)))
    assert [(e.seq, e.id) for e in stored] == [(seq, id) for seq, id, _ in log[before:]]
    assert all(e.execution_id == claim.execution_id for e in stored)


async def test_a_fenced_batch_whose_commit_answer_is_lost_is_stored_and_projected_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C2: a batch with projections (the fenced path) commits, then its connection fails;
    the retry returns the original seqs and ids, and the projection holds each event once."""
    with injecting(monkeypatch) as faults:
        ((sid, claim),) = await claimed(store)
        before = len(await _log(store, sid))
        batch = [ev.Synthetic(session_id=sid, text=f"note {i}") for i in range(3)]
        faults.arm(commit_then_fail=1)
        stored = await store.append(claim, batch)
        assert faults.seen == {"commit_then_fail": 1}
    log = await _log(store, sid)
    assert len(log) == before + 3
    assert [(e.seq, e.id) for e in stored] == [(seq, id) for seq, id, _ in log[before:]]
    texts = [m for m in await store.sessions.messages(sid) if getattr(m, "text", None)]
    assert [m.text for m in texts] == ["note 0", "note 1", "note 2"]  # type: ignore[attr-defined]


async def test_an_append_whose_connection_keeps_failing_is_a_typed_error_and_writes_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C2: the commit lands but both the append and its retry lose their answer: the caller
    gets ``StoreUnavailableError`` (its turn then restarts), and the batch is stored once."""
    with injecting(monkeypatch) as faults:
        ((sid, claim),) = await claimed(store)
        before = len(await _log(store, sid))
        faults.arm(commit_then_fail=2)
        with pytest.raises(StoreUnavailableError):
            await store.append(claim, deltas(sid, 4), step_attempt=1)
    assert len(await _log(store, sid)) == before + 4
