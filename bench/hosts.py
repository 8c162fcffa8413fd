"""What placing a session's tools on a named host costs (issue 28):
``.venv/bin/python bench/hosts.py [--database URL]...``; also run by ``make bench``, on SQLite
and on PostgreSQL when a server is named.

A tool call's latency from the store's stamps, from ``session.tool.called`` (the turn saw the
call's whole input) to ``session.tool.success`` (its result settled): the workflow's dispatch,
the activity's start, the tool (``read`` of a small file) and the settlement. Two workers in one
process, each on a task queue of its own: one the ``local`` host (its tools on the shared
queue, where Temporal may start them eagerly), one a named host (its tools on
``<queue>@<host>``, always through matching). Sessions alternate one by one between them after
a warm-up, five sequential calls each. Printed: median and p95 ms of each, and the extra
latency of the named host's queue. Target: <= 5 ms median.

Each database runs against the same Temporal dev server (the venv's ``temporal`` binary) with
the scripted model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bench.drain import database_url, dev_server  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SessionClient  # noqa: E402
from sessionflow.models.drain import LOCAL_HOST  # noqa: E402
from store import open_store  # noqa: E402
from worker import build_worker  # noqa: E402

TARGET_MS = 5.0
HOST = "bench-host"
CALLS = 5


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def script(root: Path) -> str:
    turns: list[dict[str, Any]] = [
        {"events": [{"tool_call": {"id": f"r{i}", "name": "read", "input": {"path": "a.txt"}}}]}
        for i in range(CALLS)
    ]
    turns.append({"events": [{"text": "done"}]})
    path = root / "reads.json"
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted/{path}"


async def calls(client: SessionClient, workspace: Path, model: str) -> list[float]:
    """Each call's tool.called -> tool.success of one session, ms."""
    sid = await client.create_session(workspace=str(workspace), model=model)
    await client.prompt(sid, "Read it")
    await client.wait_idle(sid, timeout=120)
    called: dict[str, int] = {}
    settled: dict[str, int] = {}
    async for event in client.events(sid):
        if event.type == "session.tool.called":
            called[event.data["call_id"]] = event.created
        elif event.type == "session.tool.success":
            settled[event.data["call_id"]] = event.created
        elif event.type == "session.tool.failed":
            raise SystemExit(f"a read FAILED in {sid}: {event.data}")
    if set(settled) != set(called) or len(called) != CALLS:
        raise SystemExit(f"{sid}: {len(called)} calls, {len(settled)} settled")
    return [float(settled[call] - called[call]) for call in called]


async def measure(env: WorkflowEnvironment, database: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sessionflow-hosts-bench-") as directory:
        root = Path(directory)
        workspace = root / "workspace"
        workspace.mkdir()
        (workspace / "a.txt").write_text("hello\n")
        model = script(root)
        async with database_url(database, root) as url:
            dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
            print(f"\n=== store: {dialect} ===")
            store = await open_store(url)
            stamp = time.monotonic_ns()
            queues = {LOCAL_HOST: f"bench-hosts-local-{stamp}", HOST: f"bench-hosts-named-{stamp}"}
            workers = [
                build_worker(
                    env.client,
                    store,
                    task_queue=queue,
                    host=host,
                    graceful_shutdown=timedelta(seconds=1),
                )
                for host, queue in queues.items()
            ]
            try:
                async with workers[0], workers[1]:
                    clients = {
                        host: SessionClient(env.client, store, task_queue=queue, host=host)
                        for host, queue in queues.items()
                    }
                    await report(clients, workspace, model, rounds)
            finally:
                await store.close()


async def report(
    clients: dict[str, SessionClient], workspace: Path, model: str, rounds: int
) -> None:
    for _ in range(3):  # warm-up
        for client in clients.values():
            await calls(client, workspace, model)
    samples: dict[str, list[float]] = {host: [] for host in clients}
    for _ in range(rounds):
        for host, client in clients.items():
            samples[host] += await calls(client, workspace, model)
    print(f"tool call latency, called -> settled, {rounds * CALLS} calls each (ms):  median    p95")
    for host, label in ((LOCAL_HOST, "local host (shared queue)"), (HOST, f"host {HOST}")):
        values = samples[host]
        print(f"  {label:<44} {statistics.median(values):7.1f} {p95(values):7.1f}")
    extra = statistics.median(samples[HOST]) - statistics.median(samples[LOCAL_HOST])
    tail = p95(samples[HOST]) - p95(samples[LOCAL_HOST])
    verdict = "met" if extra <= TARGET_MS else "NOT met"
    print(f"  extra on the host's queue: median {extra:+.1f} ms, p95 {tail:+.1f} ms")
    print(f"  (target <= {TARGET_MS:.0f} ms median: {verdict})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    env = await dev_server()
    try:
        for database in args.database or ["sqlite"]:
            await measure(env, database, args.rounds)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)
