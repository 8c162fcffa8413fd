"""The journal's content store (``store/blobs.py``): written once per digest, named again
when kept again, pruned by age and by total size, on both databases."""

from __future__ import annotations

import sqlalchemy as sa

from store import Store
from store.blobs import Retention, digest_of
from store.schema import blob_table

_b = blob_table.c
DAY_MS = 86_400_000


async def named(store: Store) -> dict[str, int]:
    async with store.db.read() as conn:
        rows = (await conn.execute(sa.select(_b.digest, _b.time_named))).all()
    return {digest: int(at) for digest, at in rows}


async def age(store: Store, data: bytes, days: float) -> None:
    """Pretend ``data`` was last named ``days`` ago."""
    async with store.db.write() as tx:
        moved = _b.time_named - sa.literal(int(days * DAY_MS))
        update = blob_table.update().where(_b.digest == digest_of(data)).values(time_named=moved)
        await tx.conn.execute(update)


async def test_content_kept_again_is_named_again_and_pruning_by_age_spares_it(
    store: Store,
) -> None:
    old, again, fresh = b"old content", b"kept again", b"fresh"
    await store.blobs.put_many([old, again])
    await age(store, old, 40)
    await age(store, again, 40)
    await store.blobs.put_many([again, fresh])  # a later call kept the same content again
    assert (await named(store))[digest_of(again)] > (await named(store))[digest_of(old)]

    pruned = await store.blobs.prune(Retention(unnamed_ms=30 * DAY_MS, max_bytes=None))

    assert (pruned.blobs, pruned.bytes) == (1, len(old))
    assert await store.blobs.get(digest_of(old)) is None
    assert await store.blobs.get(digest_of(again)) == again
    assert await store.blobs.get(digest_of(fresh)) == fresh


async def test_pruning_by_size_keeps_the_most_recently_named_within_the_bound(
    store: Store,
) -> None:
    contents = [bytes([n]) * 100 for n in range(5)]  # 100 bytes each
    await store.blobs.put_many(contents)
    for n, data in enumerate(contents):
        await age(store, data, 5 - n)  # the last one named most recently

    pruned = await store.blobs.prune(Retention(unnamed_ms=None, max_bytes=250))

    assert (pruned.blobs, pruned.bytes) == (3, 300)
    kept = [data for data in contents if await store.blobs.get(digest_of(data)) is not None]
    assert kept == contents[3:]
    nothing = await store.blobs.prune(Retention(unnamed_ms=None, max_bytes=None))
    assert nothing.blobs == 0 and len(await named(store)) == 2
