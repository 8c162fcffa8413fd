"""A benchmark worker in its own process: ``python -m bench.worker ADDRESS QUEUE URL``.

The drain benchmark's two-worker round starts two of these on one task queue and one store. It
prints ``ready`` once polling and, on stdin closing, stops and prints its CPU seconds.
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import timedelta

from bench.drain import Clock, bench_tools
from sessionflow.cli import leave
from sessionflow.settings import Settings
from store import open_store
from worker import build_worker, connect


async def main(address: str, task_queue: str, url: str) -> None:
    store = await open_store(url, settings=Settings(database_url=url), migrate=False)
    client = await connect(address)
    worker = build_worker(
        client,
        store,
        task_queue=task_queue,
        tools=bench_tools(Clock()),
        graceful_shutdown=timedelta(seconds=1),
    )
    async with worker:
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)
    await store.close()
    print(f"cpu {time.process_time()}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
    leave(0)  # the Temporal runtime can crash a finalizing interpreter (PyGILState_Release)
