"""Content the file-change journal keeps, addressed by digest (``sha256:<hex>``).

A blob is written once, whoever writes it first (the same content from two sessions, or from a
retried call, is one row), and is never changed; a revert reads it back to restore a file. It
is written before the settlement that names it, outside the claim's fence: a blob nobody's
journal names costs space and nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import sqlalchemy as sa

from store.db import Database
from store.dialect import insert, now_ms
from store.schema import blob_table

_b = blob_table.c


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Blobs:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def put_many(self, contents: Iterable[bytes]) -> list[str]:
        """Keep each content (once per digest); their digests, in order."""
        rows = {digest_of(data): data for data in contents}
        if rows:
            statement = insert(self.db.dialect, blob_table).on_conflict_do_nothing(
                index_elements=[_b.digest]
            )
            values = [{"digest": d, "size": len(data), "data": data} for d, data in rows.items()]
            async with self.db.write() as tx:
                await tx.conn.execute(
                    statement.values(
                        digest=sa.bindparam("digest"),
                        size=sa.bindparam("size"),
                        data=sa.bindparam("data"),
                        time_created=now_ms(self.db.dialect),
                    ),
                    values,
                )
        return list(rows)

    async def get(self, digest: str) -> bytes | None:
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(_b.data).where(_b.digest == digest))).first()
        return None if row is None else bytes(row[0])
