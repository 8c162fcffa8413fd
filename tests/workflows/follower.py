"""A follower in its own process: ``python -m tests.workflows.follower URL SCHEMA SESSION``.

Prints one JSON line per event (type and data) as the store's live log delivers it, the way
any reader of the store follows a session; it runs until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

from store import open_store


async def main(url: str, schema: str | None, session_id: str) -> None:
    store = await open_store(url, schema=schema)
    print(json.dumps({"type": "ready"}), flush=True)
    async for event in store.events.log(session_id, follow=True):
        data = getattr(event, "data", None)
        if data is not None:
            print(json.dumps({"type": data.type, "data": data.model_dump(mode="json")}), flush=True)


if __name__ == "__main__":
    url, schema, session_id = sys.argv[1:4]
    asyncio.run(main(url, None if schema == "-" else schema, session_id))
