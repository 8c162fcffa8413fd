"""Test-only event definitions and small helpers for the store suite."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import sqlalchemy as sa

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
