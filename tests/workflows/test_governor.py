"""One rate governor for every session (issue 30 §3): many sessions against a local fake
OpenAI-compatible server that counts requests and concurrent streams and answers 429 with
``Retry-After`` once its per-minute count is passed. Real Temporal, both databases."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.capacity import Capacity
from activities.providers.base import Provider
from activities.providers.registry import make_provider
from activities.providers.settings import ProviderSettings
from sessionflow.models.common import ModelRef
from store import Store
from store.governor import RateLimits
from tests.activities.providers.support import recording
from tests.workflows.harness import Harness, harness

MODEL = "openai-chat/gpt-4o-mini"
TERMINALS = {f"session.execution.{end}" for end in ("succeeded", "failed", "interrupted")}


@dataclass
class FakeProvider:
    """Chat Completions streams, ``burst`` requests at a time; then 429 with ``Retry-After``
    for ``retry_after`` seconds, after which it counts afresh."""

    burst: int = 1000
    retry_after: int = 3
    chunk_delay: float = 0.01
    # The first ``gather`` streams wait for each other (up to 20 s): a latch that makes the
    # concurrency limit reached, whatever the machine's speed.
    gather: int = 0
    arrivals: list[float] = field(default_factory=list)
    limited: list[float] = field(default_factory=list)  # when each 429 was answered
    streaming: int = 0
    most_streaming: int = 0
    _count: int = 0
    _closed_until: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _gathered: threading.Condition = field(default_factory=threading.Condition)

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        fake = self
        chunks = recording("chat_text.sse")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not fake.admit():
                    self.send_response(429)
                    self.send_header("Retry-After", str(fake.retry_after))
                    self.send_header("Content-Type", "application/json")
                    body = b'{"error": {"type": "rate_limit", "message": "Rate limit reached"}}'
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                try:
                    fake.wait_for_company()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for chunk in chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(fake.chunk_delay)
                finally:
                    with fake._lock:
                        fake.streaming -= 1

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}/v1"

    def wait_for_company(self) -> None:
        with self._gathered:
            if len(self.arrivals) <= self.gather:
                self._gathered.notify_all()
                self._gathered.wait_for(lambda: self.streaming >= self.gather, timeout=30)

    def release(self) -> None:
        with self._gathered:
            self.gather = 0
            self._gathered.notify_all()

    def admit(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self.arrivals.append(now)
            if now < self._closed_until or self._count >= self.burst:
                if now >= self._closed_until:
                    self._closed_until = now + self.retry_after
                    self._count = 0
                self.limited.append(now)
                return False
            self._count += 1
            self.streaming += 1
            self.most_streaming = max(self.most_streaming, self.streaming)
            return True


@dataclass
class Fleet:
    h: Harness
    fake: FakeProvider

    async def run(self, sessions: int) -> list[str]:
        ids = [
            await self.h.client.create_session(workspace=str(self.h.workspace), model=MODEL)
            for _ in range(sessions)
        ]
        await asyncio.gather(*(self.h.client.prompt(sid, "Say hi") for sid in ids))
        await asyncio.gather(*(self.h.client.wait_idle(sid, timeout=120) for sid in ids))
        return ids

    async def outcomes(self, ids: list[str]) -> set[str]:
        ends = set()
        for sid in ids:
            ends |= {
                e.type
                for e in await self.h.events(sid)
                if e.type.startswith("session.execution.") and e.type != "session.execution.started"
            }
        return ends


@pytest.fixture
def fake() -> Iterator[tuple[FakeProvider, str]]:
    provider = FakeProvider()
    server, url = provider.serve()
    yield provider, url
    server.shutdown()


def fleet(fake: FakeProvider, url: str, limits: RateLimits) -> dict[str, object]:
    settings = ProviderSettings(openai_api_key="sk-test", openai_base_url=url, read_timeout_s=10)

    # Made once, before the worker starts: importing the SDK and building its client would
    # hold the event loop (and the turns' heartbeats) for seconds in the first turns.
    made = make_provider(ModelRef.parse(MODEL), settings)
    assert made is not None

    def providers(_model: ModelRef) -> Provider:
        assert made is not None
        return made

    capacity = Capacity(limits={"openai": limits}, settings=settings)
    return {"providers": providers, "capacity": capacity, "retry_backoff_ms": 200}


async def test_one_rate_limit_answer_holds_back_every_session(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, fake: tuple[FakeProvider, str]
) -> None:
    env, root = temporal_env, tmp_path
    provider, url = fake
    provider.burst = 5
    # One stream at a time: a session that got the 429 still holds the key's only slot when
    # it closes the key, so no other request can slip in between.
    options = fleet(provider, url, RateLimits(streams=1))
    async with harness(env.client, store, root, **options) as h:
        ids = await Fleet(h, provider).run(12)
        assert await Fleet(h, provider).outcomes(ids) == {"session.execution.succeeded"}
    # Each rate-limit answer held every session back for its Retry-After: one answer per
    # burst of the fake's count, never one per session.
    assert provider.limited
    for answered in provider.limited:
        during = [t for t in provider.arrivals if answered < t < answered + provider.retry_after]
        assert during == [], f"{len(during)} request(s) during a Retry-After"
    assert len(provider.limited) <= -(-12 // provider.burst)
    assert provider.most_streaming == 1


async def test_the_concurrency_limit_holds_across_twenty_sessions(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, fake: tuple[FakeProvider, str]
) -> None:
    env, root = temporal_env, tmp_path
    provider, url = fake
    provider.gather = 3
    options = fleet(provider, url, RateLimits(streams=3))
    async with harness(env.client, store, root, **options) as h:
        ids = await Fleet(h, provider).run(20)
        assert await Fleet(h, provider).outcomes(ids) == {"session.execution.succeeded"}
        capacity = options["capacity"]
        assert isinstance(capacity, Capacity)
        key = capacity.key(ModelRef.parse(MODEL))
        assert key is not None and key.startswith("openai@127.0.0.1:")
        state = await store.governor.state(key)
        assert state["streams"] == 0 and state["waiters"] == 0
    assert len(provider.arrivals) == 20  # nobody was refused, nobody asked twice
    assert provider.most_streaming == 3  # reached (the fake's latch), never passed


async def test_a_session_waiting_for_capacity_says_so_and_an_interrupt_settles_it(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, fake: tuple[FakeProvider, str]
) -> None:
    env, root = temporal_env, tmp_path
    provider, url = fake
    provider.gather = 2  # the first stream holds the key's only slot until released
    options = fleet(provider, url, RateLimits(streams=1))
    async with harness(env.client, store, root, **options) as h:
        make = h.client.create_session
        holder = await make(workspace=str(h.workspace), model=MODEL)
        waiter = await make(workspace=str(h.workspace), model=MODEL)
        await h.client.prompt(holder, "Hold the slot")
        await h.until(lambda: provider.streaming == 1, timeout=30)
        await h.client.prompt(waiter, "Wait for it")

        async def says_it_waits() -> bool:
            drain = (await h.client.status(waiter)).drain
            return bool(drain and drain.waiting_capacity)

        await h.until(says_it_waits, timeout=30)
        drain = (await h.client.status(waiter)).drain
        assert drain is not None and drain.waiting_capacity is not None
        assert "waiting for provider capacity (key openai@127.0.0.1:" in drain.waiting_capacity
        assert "1 concurrent streams" in drain.waiting_capacity
        await h.client.interrupt(waiter)
        await h.client.wait_idle(waiter, timeout=30)
        assert provider.streaming == 1  # settled while the holder still streams
        ends = [e.data for e in await h.events(waiter) if e.type in TERMINALS]
        assert [e.get("reason") for e in ends] == ["user"]
        assert len(provider.arrivals) == 1  # the waiter never asked
        provider.release()
        await h.client.wait_idle(holder, timeout=30)
    assert {e.type for e in await h.events(holder) if e.type in TERMINALS} == {
        "session.execution.succeeded"
    }
