"""A worker in its own process, for crash tests: ``python -m tests.workflows.worker_proc``.

Arguments: temporal address, task queue, database URL, schema ('-' for none). It prints
``ready`` once polling (after reaping the tool groups of dead workers, as every worker
does at start) and runs until killed; SIGTERM shuts it down gracefully, as a deploy does
(``SESSIONFLOW_TEST_GRACE_S`` seconds of grace, default 15).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sessionflow.agents import load_agents
from sessionflow.cli import leave
from sessionflow.settings import Settings
from store import open_store
from tests.workflows.tools import Gate, registry
from worker import build_worker, connect, mcp_from_env, serving


def pause_reverts(gate: str) -> None:
    """``SESSIONFLOW_TEST_REVERT_GATE``: a revert restores one path, then says so (a
    ``.reached`` file beside the gate) and waits for the gate file before the next one: a
    worker to kill between two paths."""
    from activities import journal

    restore = journal.restore
    restored = 0

    def paused(*args: Any, **kwargs: Any) -> None:
        nonlocal restored
        if restored == 1:
            Path(f"{gate}.reached").touch()
            while not Path(gate).exists():
                time.sleep(0.02)
        restore(*args, **kwargs)
        restored += 1

    journal.restore = paused


async def main(address: str, task_queue: str, url: str, schema: str | None) -> None:
    if gate := os.environ.get("SESSIONFLOW_TEST_REVERT_GATE"):
        pause_reverts(gate)
    settings = Settings.from_env()
    store = await open_store(url, schema=schema, settings=settings)
    client = await connect(address)
    grace = timedelta(seconds=float(os.environ.get("SESSIONFLOW_TEST_GRACE_S", "15")))
    worker = build_worker(
        client,
        store,
        task_queue=task_queue,
        tools=registry(Gate()),
        sandboxed=True,
        graceful_shutdown=grace,
        turn_timeout_s=settings.turn_timeout_s,
        max_concurrent_activities=settings.max_concurrent_activities,
        mcp=mcp_from_env(settings),
        agents=load_agents(settings.agents_file),
        max_depth=settings.max_depth,
        host=settings.host,
        serve=settings.serve,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with serving(worker):  # as worker.py runs it: orphans reaped before polling
        print("ready", flush=True)
        await stop.wait()
    print("stopped", flush=True)
    await store.close()


if __name__ == "__main__":
    address, task_queue, url, schema = sys.argv[1:5]
    asyncio.run(main(address, task_queue, url, None if schema == "-" else schema))
    leave(0)  # as the CLI does: the Temporal runtime can crash a finalizing interpreter
