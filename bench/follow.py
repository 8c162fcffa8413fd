"""The benchmark's follower, in its own process: ``python -m bench.follow URL AGGREGATE...``.

Follows each aggregate through the store's live log, as any reader of the store does, and prints
one JSON line per text delta it receives, stamped with this machine's clock on arrival; a
``ready`` line per aggregate once its history has been delivered (the doorbell is armed by then).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from sessionflow.models.events import TextDelta
from store import Store, open_store
from store.events import StoredEvent


async def follow(store: Store, aggregate_id: str) -> None:
    async for item in store.events.log(aggregate_id, follow=True):
        if not isinstance(item, StoredEvent):
            print(json.dumps({"ready": aggregate_id}), flush=True)
        elif isinstance(item.data, TextDelta):
            line = {"agg": aggregate_id, "delta": item.data.delta, "t": time.time()}
            print(json.dumps(line), flush=True)


async def main(url: str, aggregates: list[str]) -> None:
    store = await open_store(url, migrate=False)
    try:
        await asyncio.gather(*(follow(store, agg) for agg in aggregates))
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2:]))
