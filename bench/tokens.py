"""Token latency: the provider yields a text delta -> a follower in another process receives it.

Next to it, measured in the same run through the same follower process, the raw floor: one
event row inserted and committed by hand (the sequence bump and the insert; on PostgreSQL with
its NOTIFY, in one autocommitted statement) -> the follower receives it. The difference is what
the drain adds between the provider and the table: the turn's batching, the fenced append.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from sessionflow.models.events import TextDelta
from store import codec
from store.dialect import NOTIFY_CHANNEL, dialect_of

ROOT = Path(__file__).resolve().parents[1]


def script(directory: Path, tokens: int, gap_ms: int) -> str:
    """One text turn: ``tokens`` deltas, each followed by a pause of ``gap_ms``."""
    events: list[dict[str, Any]] = []
    for i in range(tokens):
        events += [{"text": f"tok{i} "}, {"wait_ms": gap_ms}]
    path = directory / "tokens.json"
    path.write_text(json.dumps({"turns": [{"events": events}]}))
    return f"scripted/{path}"


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class Follower:
    """``bench.follow`` in its own process; arrivals keyed by (aggregate, delta text)."""

    def __init__(self, url: str, aggregates: list[str]) -> None:
        self.url = url
        self.aggregates = aggregates
        self.arrivals: dict[tuple[str, str], float] = {}
        self.ready: set[str] = set()
        self._changed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Follower]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.follow",
            self.url,
            *self.aggregates,
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        reader = asyncio.create_task(self._read(process))
        try:
            await self.until(lambda: self.ready >= set(self.aggregates), 30)
            yield self
        finally:
            process.kill()
            await process.wait()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = json.loads(raw)
            if "ready" in line:
                self.ready.add(line["ready"])
            else:
                # A batch may carry several of the provider's deltas: each word is one.
                for word in line["delta"].split():
                    self.arrivals.setdefault((line["agg"], word), line["t"])
            self._changed.set()

    async def until(self, condition: Callable[[], bool], timeout: float) -> None:  # noqa: ASYNC109
        async def wait() -> None:
            while not condition():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)


def _raw_row(agg: str, i: int) -> dict[str, Any]:
    event = TextDelta(session_id=agg, assistant_message_id="msg_raw", ordinal=0, delta=f"raw{i}")
    return {
        "id": f"evt_raw{uuid.uuid4().hex}",
        "agg": agg,
        "created": int(time.time() * 1000),
        "type": event.stored_type(),
        "data": codec.dump_model(event),
    }


_SQLITE_RAW = (
    "INSERT INTO event_sequence (aggregate_id, seq) VALUES (:agg, 0) "
    "ON CONFLICT (aggregate_id) DO UPDATE SET seq = event_sequence.seq + 1 RETURNING seq",
    "INSERT INTO event (id, aggregate_id, seq, created, type, data) "
    "VALUES (:id, :agg, :seq, :created, :type, :data)",
)
_PG_RAW = """
WITH allocated AS (
  INSERT INTO event_sequence (aggregate_id, seq) VALUES (%(agg)s, 0)
  ON CONFLICT (aggregate_id) DO UPDATE SET seq = event_sequence.seq + 1 RETURNING seq
), inserted AS (
  INSERT INTO event (id, aggregate_id, seq, created, type, data)
  SELECT %(id)s, %(agg)s, seq, %(created)s, %(type)s, %(data)s FROM allocated RETURNING seq
)
SELECT pg_notify(%(channel)s, %(agg)s || ' ' || (SELECT seq FROM inserted))
"""


async def raw_floor(url: str, agg: str, count: int, gap_ms: int) -> dict[str, float]:
    """Insert ``count`` deltas by hand, ``gap_ms`` apart; when each insert was begun."""
    sent: dict[str, float] = {}
    if dialect_of(url) == "sqlite":
        database = make_url(url).database
        assert database
        conn = sqlite3.connect(database, isolation_level=None)
        try:
            for i in range(count):
                row = _raw_row(agg, i)
                sent[f"raw{i}"] = time.time()
                conn.execute("BEGIN IMMEDIATE")
                (row["seq"],) = conn.execute(_SQLITE_RAW[0], row).fetchone()
                conn.execute(_SQLITE_RAW[1], row)
                conn.execute("COMMIT")
                await asyncio.sleep(gap_ms / 1000)
        finally:
            conn.close()
        return sent
    libpq = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(libpq, autocommit=True) as pg:
        for i in range(count):
            row = {**_raw_row(agg, i), "channel": NOTIFY_CHANNEL}
            sent[f"raw{i}"] = time.time()
            await pg.execute(_PG_RAW, row)
            await asyncio.sleep(gap_ms / 1000)
    return sent


def latencies(
    sent: dict[tuple[str, str], float], arrivals: dict[tuple[str, str], float]
) -> list[float]:
    """ms from each sent delta to its arrival at the follower (missing ones left out)."""
    return [(arrivals[key] - t) * 1000 for key, t in sent.items() if key in arrivals]
