"""What the rate governor costs a model request (issue 30 §5):
``.venv/bin/python bench/governor.py [--database URL]...``; also run by ``make bench``, on
SQLite and on PostgreSQL when a server is named.

One request's governor work is a take before it and a give-back after it, each one write
transaction on the key's row (``store/governor.py``). Measured with capacity free (limits far
above the load): one session taking alone, then 100 sessions of one process taking at once on
the same key, each many times. Printed: median and p95 ms of a take plus its give-back. Target:
<= 2 ms median when capacity is free.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from bench.drain import database_url  # noqa: E402
from store import open_store  # noqa: E402
from store.governor import Grant, RateLimits  # noqa: E402

TARGET_MS = 2.0
KEY = "openai@api.openai.com:bench"
LIMITS = RateLimits(rpm=10_000_000, tpm=10_000_000_000, streams=100_000)


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, round(0.95 * len(values)) - 1)]


async def one_request(store: object, holder: str, into: list[float]) -> None:
    governor = store.governor  # type: ignore[attr-defined]
    started = time.perf_counter()
    grant = await governor.take(KEY, holder, 1000, LIMITS)
    assert isinstance(grant, Grant), grant
    await governor.give_back(grant, used=800)
    into.append((time.perf_counter() - started) * 1000)


async def measure(url: str, sessions: int, rounds: int) -> list[float]:
    store = await open_store(url)
    try:
        warm: list[float] = []
        for _ in range(20):
            await one_request(store, "ses_warm", warm)
        took: list[float] = []
        for _ in range(rounds):
            await asyncio.gather(*(one_request(store, f"ses_{i}", took) for i in range(sessions)))
        return took
    finally:
        await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database", action="append", default=[])
    args = parser.parse_args()
    rows = []
    for database in args.database or ["sqlite"]:
        label = "sqlite" if database == "sqlite" else "postgresql"
        for sessions, rounds in ((1, 500), (100, 10)):
            with tempfile.TemporaryDirectory() as root:
                async with database_url(database, Path(root)) as url:
                    took = await measure(url, sessions, rounds)
            rows.append((label, sessions, statistics.median(took), p95(took), len(took)))
    print("governor: take + give-back per model request, capacity free")
    print(f"{'database':<11} {'sessions':>8} {'median ms':>10} {'p95 ms':>8} {'requests':>9}")
    for label, sessions, median, high, count in rows:
        print(f"{label:<11} {sessions:>8} {median:>10.2f} {high:>8.2f} {count:>9}")
    alone = [row for row in rows if row[1] == 1]
    verdict = all(row[2] <= TARGET_MS for row in alone)
    print(f"target: <= {TARGET_MS} ms median with capacity free: {'met' if verdict else 'NOT met'}")


if __name__ == "__main__":
    asyncio.run(main())
