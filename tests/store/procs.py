"""Entry points for the multi-process store tests (run in processes of their own)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from typing import Any

from sessionflow.errors import ClaimHeldError, ClaimLostError
from sessionflow.models import events as ev
from store.claims import Claim
from store.db import DEFAULT_LEASE_MS
from tests.conftest import Target
from tests.store.helpers import Probe


def claim_racer(
    target: Target, worker: int, sessions: list[str], barrier: Any, results: Any
) -> None:
    asyncio.run(_claim_racer(target, worker, sessions, barrier, results))


async def _claim_racer(
    target: Target, worker: int, sessions: list[str], barrier: Any, results: Any
) -> None:
    store = await target.open()
    try:
        for round_, session_id in enumerate(sessions):
            await asyncio.to_thread(barrier.wait)
            execution_id, owner_id = f"exec_{round_}_{worker}", f"owner-{worker}"
            try:
                claim = await store.claims.acquire(session_id, execution_id, owner_id)
            except ClaimHeldError as held:
                # The loser writes as if it had won (epoch 1 of a fresh session): the fence
                # must refuse it.
                ghost = Claim(session_id, execution_id, owner_id, 1, 0, DEFAULT_LEASE_MS)
                refused = await _refused(store, ghost)
                results.put((round_, worker, "held", held.execution_id, refused))
                continue
            await store.append(claim, [_won(session_id)])
            results.put((round_, worker, "won", claim.epoch, False))
    finally:
        await store.close()


async def _refused(store: Any, claim: Claim) -> bool:
    try:
        await store.append(claim, [_won(claim.session_id)])
    except ClaimLostError:
        return True
    return False


def _won(session_id: str) -> ev.Event:
    return ev.Synthetic(session_id=session_id, text="won", description="claim race")


def appender(target: Target, aggregate: str, count: int, pause_every: int) -> None:
    asyncio.run(_appender(target, aggregate, count, pause_every))


async def _appender(target: Target, aggregate: str, count: int, pause_every: int) -> None:
    store = await target.open()
    store.events.registry.register(Probe)
    try:
        for value in range(count):
            await store.events.publish(Probe(session_id=aggregate, value=value))
            if pause_every and value % pause_every == pause_every - 1:
                await asyncio.sleep(0.05)
    finally:
        await store.close()


def context() -> multiprocessing.context.BaseContext:
    """Processes forked from one server that imported this module (and so the store) once:
    each starts in milliseconds, where a spawned one imports everything again (16 of them
    took about 15 s to start on the 2 cores here). The server is single-threaded and runs no
    event loop, so what a child inherits is as clean as a spawned interpreter."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload([__name__])
    return forkserver


def spawn(target: Any, *args: Any) -> multiprocessing.process.BaseProcess:
    process = context().Process(target=target, args=args)
    process.start()
    return process


def jitter() -> float:
    return random.random() * 0.002


def sqlite_worker(target: Target, session_id: str, worker: int, rounds: int, start: Any) -> None:
    """S11: one worker process's writes: a claim, then batches on the hot path (token deltas)
    and on the fenced path (events with projections), as a drain's turns write them."""
    asyncio.run(_sqlite_worker(target, session_id, worker, rounds, start))


async def _sqlite_worker(
    target: Target, session_id: str, worker: int, rounds: int, start: Any
) -> None:
    store = await target.open()
    try:
        claim = await store.claims.acquire(session_id, f"exec_w{worker}", f"owner-w{worker}")
        await asyncio.to_thread(start.wait)
        for round_ in range(rounds):
            deltas = [
                ev.TextDelta(
                    session_id=session_id, assistant_message_id="msg_a", ordinal=0, delta="t" * 4096
                )
                for _ in range(20)
            ]
            await store.append(claim, deltas, step_attempt=1)
            note = ev.Synthetic(session_id=session_id, text=f"round {round_}")
            await store.append(claim, [note], step_attempt=1)
    finally:
        await store.close()


def sqlite_reader(target: Target, session_ids: list[str], start: Any, stop: Any) -> None:
    """S11: a reader process following the writers' sessions until told to stop."""
    asyncio.run(_sqlite_reader(target, session_ids, start, stop))


async def _sqlite_reader(target: Target, session_ids: list[str], start: Any, stop: Any) -> None:
    store = await target.open()
    try:
        await asyncio.to_thread(start.wait)
        while not stop.is_set():
            for session_id in session_ids:
                await store.events.read_after(session_id, -1)
                await store.sessions.messages(session_id)
    finally:
        await store.close()


MB = 1024 * 1024


def sqlite_bulk_writer(
    target: Target, session_id: str, worker: int, held_mb: int, after: int, gates: Any
) -> None:
    """S11 at scale: ``held_mb`` 1 MB batches while a reader holds its snapshot, then, once
    it let go, ``after`` more (the writes that let a checkpoint catch up and reset the log).
    ``gates``: (start barrier, written barrier, released event)."""
    asyncio.run(_sqlite_bulk_writer(target, session_id, worker, held_mb, after, gates))


async def _sqlite_bulk_writer(
    target: Target, session_id: str, worker: int, held_mb: int, after: int, gates: Any
) -> None:
    start, written, released = gates
    store = await target.open()
    try:
        claim = await store.claims.acquire(session_id, f"exec_b{worker}", f"owner-b{worker}")
        await asyncio.to_thread(start.wait)
        for batch in range(held_mb + after):
            if batch == held_mb:
                await asyncio.to_thread(written.wait)
                await asyncio.to_thread(released.wait)
            deltas = [
                ev.TextDelta(
                    session_id=session_id,
                    assistant_message_id="msg_a",
                    ordinal=0,
                    delta=f"{batch:08d}" * (MB // 16 // 8),
                )
                for _ in range(16)
            ]
            await store.append(claim, deltas, step_attempt=1)
    finally:
        await store.close()


def sqlite_holding_reader(target: Target, session_id: str, gates: Any) -> None:
    """S11: a process that reads inside one transaction and keeps it open (a slow follower,
    an operator's shell) until told to let go. ``gates``: (start barrier, released event)."""
    asyncio.run(_sqlite_holding_reader(target, session_id, gates))


async def _sqlite_holding_reader(target: Target, session_id: str, gates: Any) -> None:
    start, released = gates
    store = await target.open()
    try:
        async with store.db.read() as conn:
            await conn.exec_driver_sql("SELECT count(*) FROM event")
            await asyncio.to_thread(start.wait)
            await asyncio.to_thread(released.wait)
    finally:
        await store.close()


def skewed_claimant(
    target: Target, session_id: str, skew_s: float, lease_ms: int, gates: Any, results: Any
) -> None:
    """F7: a worker process whose wall clock runs ``skew_s`` off true time (``time.time`` and
    ``time.time_ns`` of this process only; the test's process keeps true time). It claims
    the session and renews it twice, says so and stops renewing (as a worker that lost its
    way), then, once told the claim was taken over, tries to renew and to write as its old
    self. ``gates``: (stopped event, taken event). ``results``: what it saw, in order."""
    true_time, true_ns = time.time, time.time_ns
    time.time = lambda: true_time() + skew_s  # type: ignore[assignment]
    time.time_ns = lambda: true_ns() + int(skew_s * 1e9)  # type: ignore[assignment]
    asyncio.run(_skewed_claimant(target, session_id, lease_ms, gates, results))


async def _skewed_claimant(
    target: Target, session_id: str, lease_ms: int, gates: Any, results: Any
) -> None:
    stopped, taken = gates
    store = await target.open()
    try:
        claim = await store.claims.acquire(
            session_id, "exec_skewed", "owner-skewed", lease_ms=lease_ms
        )
        await store.append(claim, [ev.Synthetic(session_id=session_id, text="skewed 0")])
        for _ in range(2):
            claim = await store.claims.renew(claim)
        results.put(("live", claim.epoch, claim.expires_at))
        stopped.set()
        await asyncio.to_thread(taken.wait)
        for attempt in ("renew", "write"):
            try:
                if attempt == "renew":
                    await store.claims.renew(claim)
                else:
                    late = ev.Synthetic(session_id=session_id, text="skewed late")
                    await store.append(claim, [late])
                results.put((attempt, "accepted"))
            except ClaimLostError:
                results.put((attempt, "refused"))
    finally:
        await store.close()
