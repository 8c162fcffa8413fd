"""The recovery sweep's pruning of the journal's content (``activities/sweep.py``)."""

from __future__ import annotations

from activities.runtime import Runtime
from activities.sweep import SweepActivities
from activities.tools.builtin import default_registry
from store import Store
from store.blobs import Retention, digest_of
from tests.store.test_blobs import age


async def test_the_sweep_prunes_past_the_retention_at_most_every_ten_minutes(store: Store) -> None:
    runtime = Runtime(
        store=store, tools=default_registry(), retention=Retention(unnamed_ms=1000, max_bytes=None)
    )
    sweep = SweepActivities(runtime, task_queue="tq")
    await store.blobs.put_many([b"first", b"second"])
    await age(store, b"first", 1)
    await sweep._prune()
    assert await store.blobs.get(digest_of(b"first")) is None
    await age(store, b"second", 1)
    await sweep._prune()  # pruned a moment ago: not again yet
    assert await store.blobs.get(digest_of(b"second")) == b"second"
    sweep.pruned_at = (sweep.pruned_at or 0) - 600
    await sweep._prune()
    assert await store.blobs.get(digest_of(b"second")) is None
