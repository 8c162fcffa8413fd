"""How soon a session continues after an operator's button in the Temporal UI (issue 29):
``.venv/bin/python bench/operator.py [--database URL]... [--rounds N]``; also run by ``make
bench``, on SQLite and on PostgreSQL when a server is named.

For each action (Terminate, Reset to the last and to the first workflow task, Request
Cancellation) and each moment (mid-stream: the model's stream waits; mid-tool: a shell command
waits), a session is driven to that moment and the action taken through the Temporal API, as
the UI does. The time is from the action to the store's first event of the session going on:

- Terminate: the recovered busy period's ``session.execution.started`` (the deployment's sweep
  Schedule notices the closed run and wakes the session, whose new drain takes the live claim
  over at once);
- Reset: the new run's first event (the stream asked again, or the call settled);
- Cancel: the interrupted busy period's terminal event (the session is ready for a prompt).

Printed: the median and the worst of ``--rounds`` per case, and the target (5 s, every case).
Every database runs against one dev server (the venv's ``temporal`` binary), the scripted model
and the built-in tools, with the claim's default lease of 30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bench.drain import database_url, dev_server  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SessionClient  # noqa: E402
from store import Store, open_store  # noqa: E402
from tests.workflows.operator_actions import reset_workflow  # noqa: E402
from worker import build_worker, ensure_sweep_schedule  # noqa: E402

TARGET_S = 5.0
ACTIONS = ("terminate", "reset-last", "reset-first", "cancel")
MOMENTS = ("mid-stream", "mid-tool")


def script(root: Path, moment: str, n: int) -> str:
    """A model whose first turn waits at ``moment`` (on a gate file that never appears), then
    answers every later request at once."""
    gate = root / f"never-{n}"
    if moment == "mid-stream":
        first = [{"text": "streaming", "chunks": 2}, {"wait_for_file": str(gate)}, {"text": "!"}]
    else:
        command = f"while [ ! -f {gate} ]; do sleep 0.05; done"
        call = {"id": "b1", "name": "bash", "input": {"command": command, "description": "w"}}
        first = [{"tool_call": call}]
    turns = [{"events": first}] + [{"events": [{"text": f"went on {i}"}]} for i in range(4)]
    path = root / f"model-{n}.json"
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted/{path}"


async def one(
    client: SessionClient, store: Store, workspace: Path, action: str, moment: str, n: int
) -> float:
    """Seconds from ``action`` at ``moment`` to the session going on (module docstring)."""
    model = script(workspace.parent, moment, n)
    allow = [{"tool": "bash", "action": "allow"}]
    sid = await client.create_session(workspace=str(workspace), model=model, permissions=allow)
    await client.prompt(sid, "Go")
    waited = "session.text.delta" if moment == "mid-stream" else "session.tool.called"
    after = await _until(store, sid, lambda e: e.data.type == waited, after=0)
    await asyncio.sleep(0.3)  # well inside the moment
    handle = client._handle(sid)
    started = time.monotonic()
    if action == "terminate":
        await handle.terminate("bench: an operator pressed Terminate")
        went_on = "session.execution.started"
        await _until(store, sid, lambda e: e.data.type == went_on, after=after)
    elif action == "cancel":
        await handle.cancel()
        await _until(
            store, sid, lambda e: e.data.type.startswith("session.execution."), after=after
        )
    else:
        last = await _last_seq(store, sid)
        await reset_workflow(client.temporal, handle.id, to=action.removeprefix("reset-"))
        await _until(store, sid, lambda e: True, after=last)
    elapsed = time.monotonic() - started
    await client.wait_idle(sid, timeout=120)
    return elapsed


async def _last_seq(store: Store, sid: str) -> int:
    return max(
        (e.seq for e in (await store.events.read_after(sid, limit=100_000)).events), default=0
    )


async def _until(store: Store, sid: str, matches: Any, *, after: int) -> int:
    """Wait for the first event after seq ``after`` that ``matches``; its seq."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for event in (await store.events.read_after(sid, after=after, limit=10_000)).events:
            if matches(event):
                return int(event.seq)
        await asyncio.sleep(0.02)
    raise SystemExit(f"{sid}: nothing happened within 120 s")


async def measure(env: WorkflowEnvironment, database: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sessionflow-operator-bench-") as directory:
        root = Path(directory)
        workspace = root / "workspace"
        workspace.mkdir()
        async with database_url(database, root) as url:
            dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
            print(f"\n=== store: {dialect} ===")
            store = await open_store(url)
            queue = f"bench-operator-{time.monotonic_ns()}"
            worker = build_worker(env.client, store, task_queue=queue)
            schedule_id = await ensure_sweep_schedule(env.client, store=store, task_queue=queue)
            schedule = env.client.get_schedule_handle(schedule_id)
            try:
                async with worker:
                    await schedule.trigger()
                    client = SessionClient(env.client, store, task_queue=queue)
                    await report(client, store, workspace, rounds)
            finally:
                await schedule.delete()
                await store.close()


async def report(client: SessionClient, store: Store, workspace: Path, rounds: int) -> None:
    print(f"seconds from the action to the session going on, {rounds} rounds: median  worst")
    n, verdicts = 0, []
    for action in ACTIONS:
        for moment in MOMENTS:
            samples = []
            for _ in range(rounds):
                n += 1
                samples.append(await one(client, store, workspace, action, moment, n))
            worst = max(samples)
            verdicts.append(worst <= TARGET_S)
            label = f"{action}, {moment}"
            print(f"  {label:<28} {statistics.median(samples):7.2f} {worst:7.2f}")
    verdict = "met" if all(verdicts) else "NOT met"
    print(f"  (target: within {TARGET_S:.0f} s, every case: {verdict})")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=3)
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
