"""Write growth benchmark: bytes written per tool call as a step's tool count grows.

Run from the project root: ``.venv/bin/python bench/writes.py`` (``make bench`` runs it).

One step makes N tool calls (10, 50, 200 by default), each of 64 kB output, through the store as
a tool activity makes them: ``tool.called`` and then ``tool.succeeded``, each in its own fenced
transaction. For the last ten calls of each step it prints the bytes the database wrote per
call: on PostgreSQL the WAL it generated (``pg_current_wal_insert_lsn`` before and after; run it
on a quiet server, the WAL is the cluster's), on SQLite the bytes this process wrote to the
database and its WAL (``/proc/self/io`` ``wchar``: the store runs SQLite in this process). The
target: the figure stays flat as N grows, about one output's size, where rewriting the whole
message made it grow with N.

PostgreSQL: ``--database URL`` or ``SESSIONFLOW_BENCH_POSTGRES_URL``; a fresh schema, dropped at
the end.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

import psycopg  # noqa: E402

from sessionflow.models import events as ev  # noqa: E402
from sessionflow.models.common import ModelRef, TextContent  # noqa: E402
from store import Store, open_store  # noqa: E402

OUTPUT = 64 * 1024
WINDOW = 10  # the last calls of a step, measured


def _process_writes() -> int:
    with open("/proc/self/io") as io:
        for line in io:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no wchar line")


def _incompressible(size: int) -> str:
    """Random text: PostgreSQL compresses what it stores, and repeated text would hide the
    bytes a rewrite costs."""
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


async def _wal_position(store: Store) -> int:
    async with store.db.read(single=True) as conn:
        result = await conn.exec_driver_sql(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint"
        )
        return int(result.scalar_one())


async def step(store: Store, calls: int, written: Callable[[], Awaitable[int]]) -> float:
    """Bytes written per call over the last ``WINDOW`` calls of a step of ``calls`` calls."""
    sid = (await store.sessions.create("/bench")).id
    claim = await store.claims.acquire(sid, f"exec_{uuid.uuid4().hex[:8]}", "bench")
    mid = f"msg_{uuid.uuid4().hex}"
    model = ModelRef(provider_id="scripted", id="bench.json")
    await store.append(
        claim, [ev.StepStarted(session_id=sid, assistant_message_id=mid, agent="b", model=model)]
    )
    before = 0
    for n in range(calls):
        if n == calls - WINDOW:
            before = await written()
        base = {"session_id": sid, "assistant_message_id": mid, "call_id": f"call_{n}"}
        await store.append(claim, [ev.ToolCalled(**base, name="read", input={"n": n})])
        output = [TextContent(text=_incompressible(OUTPUT))]
        await store.append(claim, [ev.ToolSucceeded(**base, content=output, result="ok")])
    return (await written() - before) / WINDOW


async def measure(url: str, schema: str | None, sizes: Sequence[int]) -> list[float]:
    store = await open_store(url, schema=schema)
    try:
        if store.db.dialect == "postgresql":

            async def written() -> int:
                return await _wal_position(store)
        else:

            async def written() -> int:
                return _process_writes()

        return [await step(store, n, written) for n in sizes]
    finally:
        await store.close()


def _drop_schema(url: str, schema: str) -> None:
    conninfo = url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def report(name: str, sizes: Sequence[int], per_call: Sequence[float]) -> None:
    print(f"{name}: bytes written per tool call (64 kB output), last {WINDOW} calls of a step")
    for n, value in zip(sizes, per_call, strict=True):
        ratio = value / OUTPUT
        print(f"  {n:4d} calls in the step: {value / 1024:9.1f} kB  ({ratio:5.2f}x output)")
    growth = per_call[-1] / per_call[0]
    print(f"  growth {sizes[0]} -> {sizes[-1]} calls: {growth:.2f}x (flat: about 1x)")


async def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database", help="a PostgreSQL URL (default: the bench env variable)")
    parser.add_argument("--sizes", default="10,50,200", help="tool calls per step")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
        report("SQLite", sizes, await measure(url, None, sizes))
    postgres = args.database or os.environ.get("SESSIONFLOW_BENCH_POSTGRES_URL")
    if postgres:
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        try:
            report("PostgreSQL", sizes, await measure(postgres, schema, sizes))
        finally:
            _drop_schema(postgres, schema)


if __name__ == "__main__":
    asyncio.run(main())
