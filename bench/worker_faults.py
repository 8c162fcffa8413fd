"""The fault catalogue's worker and server faults, timed (issue 29): ``.venv/bin/python
bench/worker_faults.py [--database URL]... [--rounds N]``; also run by ``make bench``, on SQLite
and on PostgreSQL when a server is named. ``docs/reliability.md`` prints these figures beside
each row; ``bench/faults.py`` times the store's own faults.

Each case is the catalogue's fault, made for real: worker processes on a dev server of the
venv's ``temporal``, the scripted model, the test tools (``tests/workflows/worker_proc.py``).

- F2 (a paused owner): a worker (lease 1.5 s) running ``bash sleep`` is SIGSTOPped until its
  claim expires by the database clock; another execution takes the claim over; SIGCONT.
  Timed from the SIGCONT: the tool's process gone, killed by its own worker once its renewal
  is refused (bound: one renew interval, lease / 3).
- C1 (SIGKILL mid-tool): a worker leading a process group of its own runs ``bash sleep``
  (unsandboxed, so the command outlives the group kill: an orphan); the whole group is
  killed and a successor started. Timed from the kill: the orphan gone (bound: 2 leases,
  60 s) and the session idle again (its call settled, the model asked again).
- C4 (PostgreSQL restart mid-drain, a throwaway cluster of the bench's own): while the
  model streams, and while a tool runs, the server is stopped (``pg_ctl stop -m immediate``)
  as the drain's next write begins, kept down 2 s, and started. Timed from the server being
  back: the busy period succeeded (bound: 10 s after the downtime).
- C8 (SIGTERM during tools): a worker with 1 s of grace runs two tools (one retry-safe),
  another worker on the queue. Timed from the SIGTERM: the worker exited (bound: the grace
  + 5 s) and the session idle again.

Printed per database: the median and the worst of ``--rounds``, and the bound.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
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

from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bench.drain import database_url, dev_server  # noqa: E402
from bench.faults import row  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from store import Store  # noqa: E402
from tests.conftest import Target  # noqa: E402
from tests.invariants import UNSETTLED  # noqa: E402
from tests.pgcluster import Cluster  # noqa: E402
from tests.workflows.harness import Harness, call, harness  # noqa: E402
from tests.workflows.workers import (  # noqa: E402
    WorkerProcess,
    live_with,
    outside_a_write,
    recorded_in,
    sleep_marker,
)

LEASE_S = 30.0  # the claim's default lease
F2_LEASE_MS = 1500  # F2's paused owner: renewed every lease / 3
GRACE_S = 1.0
DOWN_S = 2.0


async def _since(h: Harness, start: float, predicate: Callable[[], Awaitable[bool]]) -> float:
    """Seconds from ``start`` (monotonic) until ``predicate`` holds."""
    await h.until(predicate, timeout=180)
    return time.monotonic() - start


async def _idle(h: Harness, sid: str) -> bool:
    status = await h.client.status(sid)
    return status.drain is None and (await h.types(sid))[-1] == "session.execution.succeeded"


async def sigkill_mid_tool(
    env: WorkflowEnvironment, store: Store, target: Target, root: Path
) -> tuple[float, float]:
    """C1: seconds from the group kill to the orphan gone, and to the session idle."""
    marker, records = sleep_marker(), root / "processes"
    records.mkdir()
    started: list[WorkerProcess] = []
    try:
        async with harness(env.client, store, root, start_worker=False) as h:
            doomed = WorkerProcess(
                env,
                target,
                h.client.task_queue,
                own_group=True,
                SESSIONFLOW_SANDBOX="off",
                SESSIONFLOW_PROCESS_DIR=str(records),
            )
            started.append(doomed)
            await doomed.ready()
            sid = await h.session(
                [call("b1", "bash", command=f"sleep {marker}")],
                [{"text": "finished"}],
                permissions=[{"tool": "bash", "action": "allow"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: bool(recorded_in(records, live_with(f"sleep {marker}"))))
            doomed.signal_group(signal.SIGKILL)
            killed = time.monotonic()
            successor = WorkerProcess(
                env,
                target,
                h.client.task_queue,
                SESSIONFLOW_SANDBOX="off",
                SESSIONFLOW_PROCESS_DIR=str(records),
            )
            started.append(successor)
            reaped = asyncio.create_task(_since(h, killed, _gone(marker)))
            idle = await _since(h, killed, lambda: _idle(h, sid))
            return await reaped, idle
    finally:
        for worker in started:
            worker.stop()


async def paused_owner_resumes(
    env: WorkflowEnvironment, store: Store, target: Target, root: Path
) -> float:
    """F2: seconds from a paused owner's SIGCONT to its tool's process gone (its claim was
    taken over while it was stopped)."""
    marker, records = sleep_marker(), root / "processes"
    records.mkdir()
    started: list[WorkerProcess] = []
    try:
        async with harness(env.client, store, root, start_worker=False, breaks={UNSETTLED}) as h:
            paused = WorkerProcess(
                env,
                target,
                h.client.task_queue,
                log=str(root / "paused.log"),  # its refusals, expected
                SESSIONFLOW_LEASE_MS=str(F2_LEASE_MS),
                SESSIONFLOW_SANDBOX="off",
                SESSIONFLOW_PROCESS_DIR=str(records),
            )
            started.append(paused)
            await paused.ready()
            sid = await h.session(
                [call("b1", "bash", command=f"sleep {marker}")],
                [{"text": "never asked"}],
                permissions=[{"tool": "bash", "action": "allow"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: bool(recorded_in(records, live_with(f"sleep {marker}"))))
            async with outside_a_write(target):
                paused.signal(signal.SIGSTOP)
            await h.until(lambda: _expired(h.store, sid), timeout=60)
            successor = f"exec_successor_{uuid.uuid4().hex[:8]}"
            await h.store.claims.acquire(sid, successor, "successor", lease_ms=60_000)
            paused.signal(signal.SIGCONT)
            resumed = time.monotonic()
            return await _since(h, resumed, _gone(marker))
    finally:
        for worker in started:
            worker.stop()


async def _expired(store: Store, sid: str) -> bool:
    return sid in await store.claims.expired()


def _gone(marker: str) -> Callable[[], Awaitable[bool]]:
    async def gone() -> bool:
        return not live_with(f"sleep {marker}")

    return gone


async def sigterm_during_tools(
    env: WorkflowEnvironment, store: Store, target: Target, root: Path
) -> tuple[float, float]:
    """C8: seconds from the SIGTERM to the worker's exit, and to the session idle."""
    gate = str(root / "tools-go")
    started: list[WorkerProcess] = []
    try:
        async with harness(env.client, store, root, start_worker=False) as h:
            first = WorkerProcess(
                env, target, h.client.task_queue, SESSIONFLOW_TEST_GRACE_S=str(GRACE_S)
            )
            started.append(first)
            await first.ready()
            sid = await h.session(
                [
                    call("safe", "gate", text="ran", gate=gate),
                    call("unsafe", "sleep", until_file=gate),
                ],
                [{"text": "both settled"}],
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: _running(h, sid, 2), timeout=30)
            second = WorkerProcess(env, target, h.client.task_queue)
            started.append(second)
            await second.ready()
            first.signal(signal.SIGTERM)
            sent = time.monotonic()
            code = await first.exited()
            exited = time.monotonic() - sent
            assert code == 0, f"the worker exited {code}"
            await asyncio.to_thread(Path(gate).touch)
            return exited, await _since(h, sent, lambda: _idle(h, sid))
    finally:
        for worker in started:
            worker.stop()


async def _running(h: Harness, sid: str, count: int) -> bool:
    status = await h.client.status(sid)
    return status.drain is not None and len(status.drain.running_tools) >= count


async def server_down_mid_drain(
    env: WorkflowEnvironment, cluster: Cluster, url: str, root: Path, moment: str
) -> float:
    """C4: seconds from the server being back to the busy period's success."""
    store = await Target(url).open()
    try:
        async with harness(env.client, store, root) as h:
            gate = h.gate_file(moment)
            if moment == "mid-stream":
                first: list[Any] = [{"text": "before "}, {"wait_for_file": gate}, {"text": "x"}]
            else:
                first = [call("slow", "gate", text="ran", gate=gate)]
            sid = await h.session(first, [{"text": "done"}], [{"text": "done"}])
            await h.client.prompt(sid, "Go")
            if moment == "mid-stream":
                await h.until(lambda: _has(h, sid, "session.text.delta"), timeout=30)
            else:
                await h.until(lambda: h.gate.active == 1, timeout=30)
            h.open_gate(moment)  # the drain's next write meets the outage
            await asyncio.to_thread(cluster.stop_immediate)
            await asyncio.sleep(DOWN_S)
            await asyncio.to_thread(cluster.start)
            back = time.monotonic()
            return await _since(h, back, lambda: _succeeded(h, sid))
    finally:
        if not cluster.running():
            cluster.start()
        await store.close()


async def _has(h: Harness, sid: str, kind: str) -> bool:
    return kind in await h.types(sid, deltas=True)


async def _succeeded(h: Harness, sid: str) -> bool:
    try:
        return (await h.types(sid))[-1] == "session.execution.succeeded"
    except Exception:  # the store may still be coming back
        return False


async def measure(env: WorkflowEnvironment, database: str, rounds: int) -> bool:
    with tempfile.TemporaryDirectory(prefix="sessionflow-worker-faults-") as directory:
        base = Path(directory)
        async with database_url(database, base) as url:
            target = Target(url)
            postgres = url.startswith("postgresql")
            print(f"\n=== store: {'postgresql' if postgres else 'sqlite'} ===")
            print(f"seconds, {rounds} rounds:               median   worst")
            store = await target.open()
            try:
                c1 = [
                    await sigkill_mid_tool(env, store, target, _fresh(base, f"c1-{n}"))
                    for n in range(rounds)
                ]
                c8 = [
                    await sigterm_during_tools(env, store, target, _fresh(base, f"c8-{n}"))
                    for n in range(rounds)
                ]
                # Last: each leaves its session claimed by the test's successor, unsettled.
                f2 = [
                    await paused_owner_resumes(env, store, target, _fresh(base, f"f2-{n}"))
                    for n in range(rounds)
                ]
            finally:
                await store.close()
            ok = row("F2 tool gone after the owner resumed", f2, F2_LEASE_MS / 3000)
            ok &= row("C1 orphan gone after SIGKILL", [r for r, _ in c1], 2 * LEASE_S)
            ok &= row("C1 session idle after SIGKILL", [i for _, i in c1], 2 * LEASE_S)
            ok &= row("C8 worker exited after SIGTERM", [e for e, _ in c8], GRACE_S + 5)
            print(f"  {'C8 session idle after SIGTERM':<34} " + _figures([i for _, i in c8]))
            if postgres:
                ok &= await _server_restarts(env, base, rounds)
            return ok


async def _server_restarts(env: WorkflowEnvironment, base: Path, rounds: int) -> bool:
    cluster = await asyncio.to_thread(Cluster.create)
    try:
        ok = True
        for moment in ("mid-stream", "mid-tool"):
            samples = []
            for n in range(rounds):
                url = await asyncio.to_thread(cluster.create_database, f"c4_{n}_{moment[4:]}")
                root = _fresh(base, f"c4-{moment}-{n}")
                samples.append(await server_down_mid_drain(env, cluster, url, root, moment))
            ok &= row(f"C4 done after {DOWN_S:.0f} s down, {moment}", samples, 10.0)
        return ok
    finally:
        await asyncio.to_thread(cluster.destroy)


def _fresh(base: Path, name: str) -> Path:
    root = base / name
    root.mkdir()
    return root


def _figures(samples: list[float]) -> str:
    return f"{statistics.median(samples):7.3f} {max(samples):7.3f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", action="append", help="sqlite or a PostgreSQL URL")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The faults' expected failures (activities cut off by the outage, retried), not news.
    logging.getLogger("temporalio").setLevel(logging.CRITICAL)
    logging.getLogger("store").setLevel(logging.CRITICAL)
    env = await dev_server()
    try:
        results = [await measure(env, d, args.rounds) for d in args.database or ["sqlite"]]
    finally:
        await env.shutdown()
    print("\nevery bound held" if all(results) else "\nSOME BOUND DID NOT HOLD")


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)
