"""The fault catalogue's time bounds, measured (issue 29): ``.venv/bin/python bench/faults.py
[--database URL]... [--rounds N]``; also run by ``make bench``, on SQLite and on PostgreSQL
when a server is named. ``docs/reliability.md`` prints these figures beside each row.

Each case is the catalogue's fault, made for real against the real store, and timed from the
fault to the moment the catalogue's bound is about:

- F7 (clock skew): a worker process whose wall clock runs ±lease/2 or ±2 leases off (that
  process only) claims a session, renews it and stops; a successor on true time retries as the
  claim activity does (at the expiry the refusal names, by the database clock). Timed: from
  the skewed worker's last renewal to the takeover, by the database clock. Bound: lease +
  renew interval (lease / 3) + 1 s.
- F10 (release path): a claim is released; another process, waiting, claims the session.
  Timed: from the release's commit to the other's claim. Bound: 1 s.
- S6 (PostgreSQL: the listener killed): a follower that polls once an hour has its LISTEN
  connection killed with ``pg_terminate_backend`` and, at that moment, another process commits
  an event. Timed: from the kill to the event's arrival. Bound: 2 s.
- S7 (NOTIFY lost): a follower in one process, NOTIFY suppressed (SQLite has none across
  processes: polling is all there is), another process commits. Timed: commit to arrival, the
  worst of 20 events. Bound: the poll interval, plus the one read that finds the event (10 ms).

Printed per database: the median and the worst of ``--rounds`` (S7: of its 20 events per
round), and the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

import psycopg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bench.drain import database_url  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.errors import ClaimHeldError  # noqa: E402
from sessionflow.models import events as ev  # noqa: E402
from store import Store, open_store  # noqa: E402
from store.dialect import now_ms  # noqa: E402
from store.events import StoredEvent  # noqa: E402
from tests.conftest import Target  # noqa: E402
from tests.store.procs import context, skewed_claimant, spawn  # noqa: E402

LEASE_MS = 3000
SKEWS = (-2.0, -0.5, 0.5, 2.0)
POLL_S = 0.25
READ_S = 0.01  # the read a poll makes, which finds the event


async def db_now(store: Store) -> int:
    async with store.db.read() as conn:
        return int((await conn.execute(sa.select(now_ms(store.db.dialect)))).scalar_one())


async def takeover_after_skew(target: Target, skew: float) -> float:
    """F7: seconds from the skewed worker's last renewal to the successor's takeover."""
    store = await target.open()
    try:
        sid = (await store.sessions.create("/work")).id
        ctx = context()
        stopped, taken, results = ctx.Event(), ctx.Event(), ctx.Queue()
        gates = (stopped, taken)
        a = spawn(skewed_claimant, target, sid, skew * LEASE_MS / 1000, LEASE_MS, gates, results)
        try:
            await asyncio.to_thread(stopped.wait, 60)
            _, _, expires_at = results.get(timeout=10)
            renewed_at = expires_at - LEASE_MS
            while True:
                try:
                    execution = f"exec_true_{uuid.uuid4().hex[:8]}"
                    await store.claims.acquire(sid, execution, "owner-true", lease_ms=LEASE_MS)
                    break
                except ClaimHeldError as held:  # as the claim activity's retry waits
                    await asyncio.sleep((held.remaining_ms() + 100) / 1000)
            return float(await db_now(store) - renewed_at) / 1000
        finally:
            taken.set()
            await asyncio.to_thread(a.join, 30)
    finally:
        await store.close()


def _claim_when_free(target: Target, sid: str, ready: Any, results: Any) -> None:
    asyncio.run(_claim_when_free_async(target, sid, ready, results))


async def _claim_when_free_async(target: Target, sid: str, ready: Any, results: Any) -> None:
    """F10's other worker: retries the claim at once (a release needs no lease wait)."""
    store = await target.open()
    try:
        ready.set()
        while True:
            try:
                execution = f"exec_next_{uuid.uuid4().hex[:8]}"
                await store.claims.acquire(sid, execution, "owner-next", lease_ms=LEASE_MS)
                results.put(time.time())
                return
            except ClaimHeldError:
                await asyncio.sleep(0.005)
    finally:
        await store.close()


async def claim_after_release(target: Target) -> float:
    """F10: seconds from the release's commit to another process's claim."""
    store = await target.open()
    try:
        sid = (await store.sessions.create("/work")).id
        execution = f"exec_a_{uuid.uuid4().hex[:8]}"
        claim = await store.claims.acquire(sid, execution, "owner-a", lease_ms=60_000)
        ctx = context()
        ready, results = ctx.Event(), ctx.Queue()
        other = spawn(_claim_when_free, target, sid, ready, results)
        await asyncio.to_thread(ready.wait, 60)
        await asyncio.sleep(0.2)  # the other process is retrying by now
        await store.claims.release(claim)
        released = time.time()
        claimed = await asyncio.to_thread(results.get, True, 30)
        await asyncio.to_thread(other.join, 30)
        return float(claimed - released)
    finally:
        await store.close()


class Follower:
    """One session followed live, the arrival time of each seq kept."""

    def __init__(self, store: Store, sid: str, poll_s: float) -> None:
        self.arrived: dict[int, float] = {}
        self.synced, self.changed = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(self._follow(store, sid, poll_s))

    async def _follow(self, store: Store, sid: str, poll_s: float) -> None:
        async for item in store.events.log(sid, follow=True, poll_interval=poll_s):
            if isinstance(item, StoredEvent):
                self.arrived[item.seq] = time.time()
                self.changed.set()
            else:
                self.synced.set()

    async def until(self, seq: int) -> float:
        while seq not in self.arrived:
            self.changed.clear()
            await self.changed.wait()
        return self.arrived[seq]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _publisher(target: Target, sid: str, count: int, go: Any, results: Any) -> None:
    asyncio.run(_publisher_async(target, sid, count, go, results))


async def _publisher_async(target: Target, sid: str, count: int, go: Any, results: Any) -> None:
    """Another process's commits, each stamped with this machine's clock after it committed."""
    store = await target.open()
    try:
        for _ in range(count):
            await asyncio.to_thread(go.wait)
            go.clear()
            stored = await store.events.publish(ev.Synthetic(session_id=sid, text="x"))
            results.put((stored.seq, time.time()))
    finally:
        await store.close()


async def _by_another_process(
    target: Target, follower: Follower, sid: str, count: int, before: Callable[[], Awaitable[None]]
) -> list[tuple[float, float, float]]:
    """``count`` events committed by another process, ``before`` run ahead of each: for each,
    when ``before`` began, when the event committed and when it arrived at the follower."""
    ctx = context()
    go, results = ctx.Event(), ctx.Queue()
    publisher = spawn(_publisher, target, sid, count, go, results)
    times = []
    try:
        for _ in range(count):
            started = time.time()
            await before()
            go.set()
            seq, committed = await asyncio.to_thread(results.get, True, 30)
            arrived = await asyncio.wait_for(follower.until(seq), 30)
            times.append((started, committed, arrived))
    finally:
        await asyncio.to_thread(publisher.join, 30)
    return times


async def _nothing() -> None:
    return None


async def listener_killed(target: Target, url: str) -> float:
    """S6: seconds from killing the follower's LISTEN connection to an event committed at that
    moment arriving (the follower polls once an hour: only the reconnection can bring it)."""
    store = await target.open()
    try:
        sid = (await store.sessions.create("/work")).id
        follower = Follower(store, sid, 3600)
        await asyncio.wait_for(follower.synced.wait(), 30)
        await asyncio.wait_for(_until(lambda: store.notifier.listener_pid is not None), 30)

        async def kill() -> None:
            pid = store.notifier.listener_pid
            async with await psycopg.AsyncConnection.connect(_libpq(url), autocommit=True) as c:
                await c.execute("SELECT pg_terminate_backend(%s)", [pid])

        try:
            ((killed, _, arrived),) = await _by_another_process(target, follower, sid, 1, kill)
            return arrived - killed
        finally:
            await follower.stop()
    finally:
        await store.close()


async def notify_lost(target: Target, count: int = 20) -> list[float]:
    """S7: seconds from another process's commit to its arrival, NOTIFY suppressed."""
    import store.notify as notify

    channel = notify.NOTIFY_CHANNEL  # type: ignore[attr-defined]
    notify.NOTIFY_CHANNEL = "sessionflow_bench_nobody_rings"  # type: ignore[attr-defined]
    follower_store = await target.open()
    try:
        sid = (await follower_store.sessions.create("/work")).id
        follower = Follower(follower_store, sid, POLL_S)
        await asyncio.wait_for(follower.synced.wait(), 30)
        try:
            times = await _by_another_process(target, follower, sid, count, _nothing)
            return [arrived - committed for _, committed, arrived in times]
        finally:
            await follower.stop()
    finally:
        await follower_store.close()
        notify.NOTIFY_CHANNEL = channel  # type: ignore[attr-defined]


async def _until(predicate: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0.01)


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def row(label: str, samples: list[float], bound: float) -> bool:
    worst = max(samples)
    verdict = "within" if worst <= bound else "OVER"
    print(
        f"  {label:<34} {statistics.median(samples):7.3f} {worst:7.3f}   bound {bound:6.2f} s"
        f"  {verdict}"
    )
    return worst <= bound


async def measure(database: str, rounds: int) -> bool:
    with tempfile.TemporaryDirectory(prefix="sessionflow-faults-bench-") as directory:
        async with database_url(database, Path(directory)) as url:
            target = Target(url)
            postgres = url.startswith("postgresql")
            print(f"\n=== store: {'postgresql' if postgres else 'sqlite'} ===")
            print(f"seconds, {rounds} rounds:               median   worst")
            await (await open_store(url)).close()  # migrated once, before the processes
            ok = True
            for skew in SKEWS:
                samples = [await takeover_after_skew(target, skew) for _ in range(rounds)]
                label = f"F7 takeover, clock {skew:+.1f} leases"
                ok &= row(label, samples, LEASE_MS / 1000 * (1 + 1 / 3) + 1)
            samples = [await claim_after_release(target) for _ in range(rounds)]
            ok &= row("F10 claim after a release", samples, 1.0)
            if postgres:
                samples = [await listener_killed(target, url) for _ in range(rounds)]
                ok &= row("S6 event after the listener died", samples, 2.0)
            samples = [max(await notify_lost(target)) for _ in range(rounds)]
            label = f"S7 no NOTIFY, poll {POLL_S:.2f} s (worst/20)"
            ok &= row(label, samples, POLL_S + READ_S)
            return ok


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    multiprocessing.set_start_method("forkserver", force=True)
    logging.getLogger("store.notify").setLevel(logging.ERROR)  # S6's reconnections, expected
    results = [await measure(database, args.rounds) for database in args.database or ["sqlite"]]
    print("\nevery bound held" if all(results) else "\nSOME BOUND DID NOT HOLD")


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)
