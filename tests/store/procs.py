"""Entry points for the multi-process store tests (run in spawned processes)."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from typing import Any

from sessionflow.errors import ClaimHeldError
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
            try:
                claim = await store.claims.acquire(
                    session_id, f"exec_{round_}_{worker}", f"owner-{worker}"
                )
                results.put((round_, worker, "won", claim.epoch))
            except ClaimHeldError as held:
                results.put((round_, worker, "held", held.execution_id))
    finally:
        await store.close()


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


def spawn(target: Any, *args: Any) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    return process


def jitter() -> float:
    return random.random() * 0.002
