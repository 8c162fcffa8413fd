"""What rewind costs (issue 31): ``.venv/bin/python bench/rewind.py [--database URL]...``;
also run by ``make bench``, on SQLite and on PostgreSQL when a server is named.

1. The journal's cost per tool call in a 10,000-file workspace where the call changes one
   4 KiB file: for ``write`` (its path read before and after) and for ``bash`` (the changed path
   its snapshots found, read after), the time the journal adds to the call (reading, hashing,
   keeping the contents in the store) and the bytes it stores (blobs and the event) against
   the bytes changed: the first change of a file keeps its content before and after; later
   changes find their "before" already kept. Targets: <= 10 ms, <= 2x the changed bytes.
2. A revert of 100 files a shell command changed, end to end as ``SessionClient.revert`` runs it
   (its busy period, the plan, the restores, the event), median of 5. Target: <= 1 s.
3. A fork of a session in the 10,000-file workspace (its copy, the path put back, the fork's
   log), median of 3: no target, a figure to watch.

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

from activities import journal  # noqa: E402
from activities.tools.base import ToolOutput  # noqa: E402
from activities.tools.changes import changed, snapshot  # noqa: E402
from activities.tools.settings import ToolSettings  # noqa: E402
from bench.drain import database_url, dev_server  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SessionClient  # noqa: E402
from sessionflow.models import events as ev  # noqa: E402
from sessionflow.models.messages import AssistantMessage  # noqa: E402
from store import Store, open_store  # noqa: E402
from store.blobs import digest_of  # noqa: E402
from worker import build_worker  # noqa: E402

FILES = 10_000
CHANGED = 4096
TARGET_MS, TARGET_RATIO, TARGET_REVERT_S = 10.0, 2.0, 1.0


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


def populate(root: Path) -> None:
    for i in range(FILES):
        directory = root / f"d{i // 100:03d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{i:05d}.txt").write_bytes(b"x" * 512)


async def journal_cost(store: Store, root: Path, tool: str, rounds: int) -> dict[str, float]:
    """The journal's time and bytes for one call changing one file, over ``rounds`` calls."""
    settings = ToolSettings()
    target = "d042/f04242.txt"
    times: list[float] = []
    ratios: list[float] = []
    first_ratio = 0.0
    for n in range(rounds):
        content = (f"{tool}{n:08d}".encode() * CHANGED)[:CHANGED]  # new content every call
        before_snapshot = snapshot(str(root), settings) if tool == "bash" else {}
        assert before_snapshot is not None
        started = time.perf_counter()
        before = journal.capture(str(root), settings, [target]) if tool == "write" else {}
        journal_ms = (time.perf_counter() - started) * 1000
        (root / target).write_bytes(content)  # the call itself
        if tool == "bash":
            after_snapshot = snapshot(str(root), settings)
            assert after_snapshot is not None
            paths = changed(before_snapshot, after_snapshot)
            seen = {path: before_snapshot.get(path) for path in paths}
            output = ToolOutput(output_paths=paths, seen_before=seen)
        else:
            output = ToolOutput(output_paths=(target,))
        started = time.perf_counter()
        found, kept = journal.changes(str(root), settings, before, output)
        new = await _new_bytes(store, kept)
        await store.blobs.put_many(kept)
        journal_ms += (time.perf_counter() - started) * 1000
        event = ev.FilesChanged(
            session_id="ses_bench",
            assistant_message_id="msg_b",
            call_id=f"c{n}",
            changes=tuple(found),
        )
        stored = new + len(event.model_dump_json())
        times.append(journal_ms)
        if n == 0:
            first_ratio = stored / CHANGED
        else:
            ratios.append(stored / CHANGED)
    return {
        "median_ms": statistics.median(times),
        "p95_ms": p95(times),
        "first_ratio": first_ratio,
        "ratio": statistics.median(ratios),
    }


async def _new_bytes(store: Store, contents: list[bytes]) -> int:
    """The bytes of ``contents`` the blob table does not hold yet."""
    fresh = 0
    for digest, data in {digest_of(d): d for d in contents}.items():
        if await store.blobs.get(digest) is None:
            fresh += len(data)
    return fresh


def script(root: Path, name: str, *turns: list[dict[str, Any]]) -> str:
    path = root / f"{name}.json"
    path.write_text(json.dumps({"turns": [{"events": events} for events in turns]}))
    return f"scripted/{path}"


def bash(command: str) -> list[dict[str, Any]]:
    return [{"tool_call": {"id": "b", "name": "bash", "input": {"command": command}}}]


async def revert_time(client: SessionClient, root: Path, rounds: int) -> list[float]:
    """Seconds for ``revert`` of 100 files the second prompt's command changed."""
    took: list[float] = []
    for n in range(rounds):
        workspace = root / f"revert{n}"
        workspace.mkdir()
        model = script(
            root,
            f"revert{n}",
            bash("for i in $(seq 100); do echo first $i > f$i.txt; done"),
            [{"text": "created"}],
            bash("for i in $(seq 100); do echo second $i >> f$i.txt; done"),
            [{"text": "changed"}],
        )
        allow = [{"tool": "bash", "action": "allow"}]
        sid = await client.create_session(workspace=str(workspace), model=model, permissions=allow)
        for text in ("create", "change"):
            await client.prompt(sid, text)
            await client.wait_idle(sid, timeout=120)
            if text == "create":
                messages = await client.messages(sid)
                mark = next(m.id for m in reversed(messages) if isinstance(m, AssistantMessage))
        started = time.perf_counter()
        plan = await client.revert(sid, mark)
        took.append(time.perf_counter() - started)
        assert plan.applied and len(plan.paths) == 100, plan.refused or plan.refusals
        assert (workspace / "f7.txt").read_text() == "first 7\n"
    return took


async def fork_time(client: SessionClient, root: Path, big: Path, rounds: int) -> list[float]:
    """Seconds for ``fork`` of a session in the ``FILES``-file workspace, at its first prompt
    (the copy puts back the one file the session wrote after it)."""
    model = script(
        root,
        "fork",
        [{"tool_call": {"id": "w", "name": "write", "input": {"path": "new.txt", "content": "x"}}}],
        [{"text": "written"}],
    )
    sid = await client.create_session(workspace=str(big), model=model)
    receipt = await client.prompt(sid, "write")
    await client.wait_idle(sid, timeout=120)
    took: list[float] = []
    for n in range(rounds):
        started = time.perf_counter()
        plan = await client.fork(sid, receipt.id, workspace=str(root / f"fork{n}"))
        took.append(time.perf_counter() - started)
        assert plan.applied and not (root / f"fork{n}" / "new.txt").exists(), plan
    return took


async def measure(temporal: Client, database: str, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sessionflow-rewind-bench-") as directory:
        root = Path(directory)
        async with database_url(database, root) as url:
            dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
            print(f"\n=== store: {dialect} ===")
            store = await open_store(url)
            try:
                big = root / "big"
                big.mkdir()
                populate(big)
                print(f"1. the journal per call, {FILES} files, one {CHANGED}-byte file changed:")
                for tool in ("write", "bash"):
                    cost = await journal_cost(store, big, tool, rounds)
                    ok = cost["median_ms"] <= TARGET_MS and cost["ratio"] <= TARGET_RATIO
                    print(
                        f"   {tool:5s}: {cost['median_ms']:.2f} / {cost['p95_ms']:.2f} ms "
                        f"(median / p95); bytes stored {cost['ratio']:.2f}x the changed bytes "
                        f"({cost['first_ratio']:.2f}x on the file's first change): "
                        f"{'met' if ok else 'NOT met'}"
                    )
                queue = f"bench-rewind-{time.monotonic_ns()}"
                worker = build_worker(
                    temporal,
                    store,
                    task_queue=queue,
                    graceful_shutdown=timedelta(seconds=1),
                )
                async with worker:
                    client = SessionClient(temporal, store, task_queue=queue)
                    took = await revert_time(client, root, 5)
                    forked = await fork_time(client, root, big, 3)
                median = statistics.median(took)
                verdict = "met" if median <= TARGET_REVERT_S else "NOT met"
                print(
                    f"2. revert of 100 files: {median:.3f} s median, {max(took):.3f} s worst "
                    f"of {len(took)} (target <= {TARGET_REVERT_S:g} s: {verdict})"
                )
                print(
                    f"3. fork of a {FILES}-file workspace: {statistics.median(forked):.3f} s "
                    f"median of {len(forked)} (no target: the copy is the cost)"
                )
            finally:
                await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=30)
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
