"""A long session with a small window (issue: compaction): 500 tool turns of a scripted model
whose context is 4,000 tokens, on SQLite and the Temporal dev server from the venv. Prints the
wall time, the time spent compacting (compaction started -> ended, from the events' stamps) and
how many compactions ran, next to the same session with no limits (which never compacts).

    .venv/bin/python bench/long_session.py [--turns 500] [--database URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from temporalio.client import Client  # noqa: E402

from activities.tools.testing import testing_registry  # noqa: E402
from bench.drain import dev_server  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SessionClient  # noqa: E402
from store import open_store  # noqa: E402
from worker import build_worker  # noqa: E402

LIMITS = {"context": 4000, "output": 500}


@dataclass
class Run:
    wall_s: float
    compacting_s: float
    compactions: int
    requests: int


def script(root: Path, turns: int, *, limits: bool) -> str:
    """``turns`` steps of a note and an echo call, then the answer; the summaries interleave
    with them as requests, so every turn may also answer a summary request."""
    events: list[dict[str, Any]] = []
    for i in range(turns):
        events.append(
            {
                "events": [
                    {"text": f"note {i} " + "y" * 200},
                    {"tool_call": {"id": f"c{i}", "name": "echo", "input": {"text": "z" * 200}}},
                ]
            }
        )
    # Summary requests take turns too: enough plain answers for every compaction, then the end.
    events += [{"events": [{"text": "summary so far"}]}] * turns
    body: dict[str, Any] = {"turns": events}
    if limits:
        body["limits"] = LIMITS
    path = root / ("small.json" if limits else "unlimited.json")
    path.write_text(json.dumps(body))
    return f"scripted/{path}"


async def one(client: Client, url: str, root: Path, turns: int, *, limits: bool) -> Run:
    store = await open_store(url)
    queue = f"bench-long-{limits}-{time.monotonic_ns()}"
    worker = build_worker(
        client,
        store,
        task_queue=queue,
        tools=testing_registry(),
        graceful_shutdown=timedelta(seconds=1),
    )
    try:
        async with worker:
            sessions = SessionClient(client, store, task_queue=queue)
            sid = await sessions.create_session(
                workspace=str(root),
                model=script(root, turns, limits=limits),
                compaction={"keep_tokens": 400, "buffer": 500},
                max_steps=turns + 1,
            )
            started = time.perf_counter()
            await sessions.prompt(sid, "Work through the notes")
            await sessions.wait_idle(sid, timeout=3600)
            wall = time.perf_counter() - started
            events = [e async for e in sessions.events(sid)]
    finally:
        await store.close()
    opened: dict[str, int] = {}
    compacting = 0.0
    for event in events:
        key = str(event.data.get("compaction_id") or event.data.get("message_id") or "")
        if event.type == "session.compaction.started":
            opened[key] = event.created
        elif event.type in ("session.compaction.ended", "session.compaction.failed"):
            start = opened.pop(key, None)
            if start is not None:
                compacting += (event.created - start) / 1000
    ended = sum(e.type == "session.compaction.ended" for e in events)
    requests = sum(e.type == "session.step.started" for e in events)
    return Run(wall, compacting, ended, requests)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--database", default=None, help="a store URL (default: a SQLite file)")
    args = parser.parse_args()
    env = await dev_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            url = args.database or f"sqlite+aiosqlite:///{root / 'long.db'}"
            small = await one(env.client, url, root, args.turns, limits=True)
            plain = await one(env.client, url, root, args.turns, limits=False)
    finally:
        await env.shutdown()
    print(f"long session: {args.turns} tool turns, window {LIMITS['context']} tokens")
    print(
        f"  small window: {small.wall_s:.1f} s wall, {small.compactions} compactions taking "
        f"{1000 * small.compacting_s:.0f} ms in all "
        f"({100 * small.compacting_s / small.wall_s:.1f} % of the wall time), "
        f"{small.requests} steps"
    )
    print(
        f"  no limits:    {plain.wall_s:.1f} s wall, {plain.compactions} compactions, "
        f"{plain.requests} steps"
    )


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)  # the Temporal runtime can crash a finalizing interpreter (PyGILState_Release)
