"""Content the file-change journal keeps, addressed by digest (``sha256:<hex>``).

A blob is written once, whoever writes it first (the same content from two sessions, or from a
retried call, is one row), and is never changed; a revert reads it back to restore a file. It
is written before the settlement that names it, outside the claim's fence: a blob nobody's
journal names costs space and nothing else. ``prune`` bounds that space by age and by size
(the recovery sweep runs it, ``SESSIONFLOW_JOURNAL_KEEP_DAYS`` and
``SESSIONFLOW_JOURNAL_MAX_TOTAL_BYTES``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa

from store.db import Database
from store.dialect import insert, now_ms
from store.schema import blob_table

_b = blob_table.c


@dataclass(frozen=True)
class Retention:
    """How long content no journal entry names again is kept (``unnamed_ms``), and how much
    is kept in all (``max_bytes``); None: no such bound."""

    unnamed_ms: int | None = 30 * 24 * 3600 * 1000
    max_bytes: int | None = 8 * 1024**3


@dataclass(frozen=True)
class Pruned:
    """What a prune deleted: how many contents, how many bytes."""

    blobs: int
    bytes: int


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Blobs:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def put_many(self, contents: Iterable[bytes]) -> list[str]:
        """Keep each content (once per digest); their digests, in order."""
        rows = {digest_of(data): data for data in contents}
        if rows:
            now = now_ms(self.db.dialect)
            statement = insert(self.db.dialect, blob_table).values(
                digest=sa.bindparam("digest"),
                size=sa.bindparam("size"),
                data=sa.bindparam("data"),
                time_created=now,
                time_named=now,
            )
            # Kept already: named again now, so pruning keeps it longer.
            statement = statement.on_conflict_do_update(
                index_elements=[_b.digest], set_={"time_named": now}
            )
            values = [{"digest": d, "size": len(data), "data": data} for d, data in rows.items()]
            async with self.db.write() as tx:
                await tx.conn.execute(statement, values)
        return list(rows)

    async def prune(self, retention: Retention) -> Pruned:
        """Delete the content no journal entry named for ``unnamed_ms``, then, while more than
        ``max_bytes`` are kept, what was named longest ago. A revert that needed a pruned
        content refuses its path (``content-not-kept``)."""
        blobs = size = 0
        unnamed_ms, max_bytes = retention.unnamed_ms, retention.max_bytes
        async with self.db.write() as tx:
            if unnamed_ms is not None:
                cutoff = now_ms(self.db.dialect) - sa.literal(unnamed_ms)
                old = blob_table.delete().where(_b.time_named < cutoff).returning(_b.size)
                gone = (await tx.conn.execute(old)).all()
                blobs, size = blobs + len(gone), size + sum(row[0] for row in gone)
            if max_bytes is not None:
                newest_first = sa.func.sum(_b.size).over(order_by=(_b.time_named.desc(), _b.digest))
                kept = sa.select(_b.digest, newest_first.label("total")).subquery()
                over = sa.select(kept.c.digest).where(kept.c.total > max_bytes)
                big = blob_table.delete().where(_b.digest.in_(over)).returning(_b.size)
                gone = (await tx.conn.execute(big)).all()
                blobs, size = blobs + len(gone), size + sum(row[0] for row in gone)
        return Pruned(blobs, size)

    async def get(self, digest: str) -> bytes | None:
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(_b.data).where(_b.digest == digest))).first()
        return None if row is None else bytes(row[0])
