"""A worker in its own process, for crash tests: ``python -m tests.workflows.worker_proc``.

Arguments: temporal address, task queue, database URL, schema ('-' for none). It prints
``ready`` once polling, and runs until killed.
"""

from __future__ import annotations

import asyncio
import sys

from sessionflow.settings import Settings
from store import open_store
from tests.workflows.tools import Gate, registry
from worker import build_worker, connect


async def main(address: str, task_queue: str, url: str, schema: str | None) -> None:
    store = await open_store(url, schema=schema, settings=Settings.from_env())
    client = await connect(address)
    worker = build_worker(
        client, store, task_queue=task_queue, tools=registry(Gate()), sandboxed=True
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    address, task_queue, url, schema = sys.argv[1:5]
    asyncio.run(main(address, task_queue, url, None if schema == "-" else schema))
