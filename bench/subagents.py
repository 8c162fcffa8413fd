"""What a subagent costs (issue 27): ``.venv/bin/python bench/subagents.py [--database URL]...``;
also run by ``make bench``, on SQLite and on PostgreSQL when a server is named.

1. A ``task`` round trip against the same prompt run as a top-level session, interleaved one
   by one after a warm-up: for the task, from the child session's creation to the result
   settled at the parent (``session.tool.success`` of the call); for the top-level session,
   from its creation (then its prompt, as the task's child gets its own) to its busy
   period's terminal event, and from the prompt's admission alone. Both from the store's
   stamps, median and p95 ms, and their ratio. Target: <= 1.3x.
2. A tree of 1 parent x 10 children x 10 grandchildren (111 sessions, each child's ten tasks at
   once): wall time from the prompt to the parent idle, and the parent's Temporal history
   length next to a parent of 10 children without grandchildren: what a parent's history holds
   does not grow with the tree below it.

Each database runs against the same Temporal dev server (the venv's ``temporal`` binary) with
an in-process worker and the scripted model.
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

from temporalio.client import Client  # noqa: E402

from activities.tools.testing import testing_registry  # noqa: E402
from bench.drain import database_url, dev_server  # noqa: E402
from sessionflow.agents import Agent, Agents  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SessionClient  # noqa: E402
from sessionflow.models.drain import workflow_id  # noqa: E402
from store import Store, open_store  # noqa: E402
from worker import build_worker  # noqa: E402

TARGET = 1.3
TERMINALS = ("session.execution.succeeded", "session.execution.failed")


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def script(root: Path, name: str, *turns: list[dict[str, Any]]) -> str:
    path = root / f"{name}.json"
    path.write_text(json.dumps({"turns": [{"events": events} for events in turns]}))
    return f"scripted/{path}"


def tasks(count: int, agent: str) -> list[dict[str, Any]]:
    return [
        {
            "tool_call": {
                "id": f"t{i}",
                "name": "task",
                "input": {"description": f"part {i}", "prompt": "Do it", "subagent_type": agent},
            }
        }
        for i in range(count)
    ]


def agents(root: Path) -> Agents:
    answer = [{"text": "the answer"}]
    return Agents(
        {
            "echo": Agent(name="echo", mode="subagent", model=script(root, "echo", answer)),
            "leaf": Agent(name="leaf", mode="subagent", model=script(root, "leaf", answer)),
            "mid": Agent(
                name="mid",
                mode="subagent",
                model=script(root, "mid", tasks(10, "leaf"), [{"text": "mid done"}]),
            ),
        }
    )


async def events(client: SessionClient, sid: str) -> list[Any]:
    return [event async for event in client.events(sid)]


async def top_level(client: SessionClient, workspace: Path, model: str) -> tuple[float, float]:
    """(created -> terminal, prompt admitted -> terminal) of one top-level session, ms."""
    sid = await client.create_session(workspace=str(workspace), model=model)
    await client.prompt(sid, "Do it")
    await client.wait_idle(sid, timeout=120)
    created = (await client.session(sid)).time_created
    log = await events(client, sid)
    admitted = next(e.created for e in log if e.type == "session.prompt.admitted")
    ended = next(e.created for e in log if e.type in TERMINALS)
    return float(ended - created), float(ended - admitted)


async def round_trip(client: SessionClient, store: Store, workspace: Path, model: str) -> float:
    sid = await client.create_session(workspace=str(workspace), model=model)
    await client.prompt(sid, "Delegate")
    await client.wait_idle(sid, timeout=120)
    (child,) = await client.children(sid)
    settled = next(e for e in await events(client, sid) if e.type == "session.tool.success")
    return float(settled.created - child.time_created)


async def tree(client: SessionClient, workspace: Path, model: str, temporal: Client) -> Any:
    sid = await client.create_session(workspace=str(workspace), model=model, max_active_tools=10)
    started = time.perf_counter()
    await client.prompt(sid, "Delegate the whole tree")
    await client.wait_idle(sid, timeout=600)
    wall = time.perf_counter() - started
    history = await temporal.get_workflow_handle(workflow_id(sid)).fetch_history()
    kids = await client.children(sid)
    below = sum([len(await client.children(k.id)) for k in kids])
    failed = 0
    for session in [sid, *(k.id for k in kids)]:
        log = await events(client, session)
        failed += sum(e.type == "session.tool.failed" for e in log)
    if failed:
        print(f"   {failed} task calls of the tree FAILED")
    return wall, len(history.events), len(kids), below


async def measure(temporal: Client, database: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sessionflow-subagents-bench-") as directory:
        root = Path(directory)
        workspace = root / "workspace"
        workspace.mkdir()
        async with database_url(database, root) as url:
            dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
            print(f"\n=== store: {dialect} ===")
            store = await open_store(url)
            queue = f"bench-subagents-{time.monotonic_ns()}"
            known = agents(root)
            worker = build_worker(
                temporal,
                store,
                task_queue=queue,
                tools=testing_registry(),
                agents=known,
                graceful_shutdown=timedelta(seconds=1),
            )
            try:
                async with worker:
                    client = SessionClient(temporal, store, task_queue=queue, agents=known)
                    await report(client, store, root, workspace, temporal, rounds)
            finally:
                await store.close()


async def report(
    client: SessionClient,
    store: Store,
    root: Path,
    workspace: Path,
    temporal: Client,
    rounds: int,
) -> None:
    plain = script(root, "plain", [{"text": "the answer"}])
    parent = script(root, "parent", tasks(1, "echo"), [{"text": "done"}])
    for _ in range(3):  # warm-up
        await top_level(client, workspace, plain)
        await round_trip(client, store, workspace, parent)
    alone: list[float] = []
    running: list[float] = []
    delegated: list[float] = []
    for _ in range(rounds):
        whole, busy = await top_level(client, workspace, plain)
        alone.append(whole)
        running.append(busy)
        delegated.append(await round_trip(client, store, workspace, parent))
    ratio = statistics.median(delegated) / statistics.median(alone)
    print(f"1. task round trip over {rounds} runs (ms, median / p95):")
    for label, values in (
        ("top-level session, created -> terminal", alone),
        ("  of which prompt admitted -> terminal", running),
        ("task, child created -> result settled ", delegated),
    ):
        print(f"   {label}:  {statistics.median(values):7.1f} / {p95(values):7.1f}")
    verdict = "met" if ratio <= TARGET else "NOT met"
    print(f"   ratio {ratio:.2f}x (target <= {TARGET}x: {verdict})")
    flat = script(root, "flat", tasks(10, "echo"), [{"text": "done"}])
    deep = script(root, "deep", tasks(10, "mid"), [{"text": "done"}])
    _, flat_history, _, _ = await tree(client, workspace, flat, temporal)
    wall, deep_history, kids, grandchildren = await tree(client, workspace, deep, temporal)
    shape = f"1 x {kids} x {grandchildren // max(1, kids)}"
    print(f"2. tree of {shape} ({1 + kids + grandchildren} sessions):")
    print(f"   wall {wall:.2f} s; the parent's history: {deep_history} events")
    print(f"   (a parent of {kids} children without grandchildren: {flat_history} events)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    env = await dev_server()
    try:
        for database in args.database or ["sqlite"]:
            await measure(env.client, database, args.rounds)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)
