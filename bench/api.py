"""HTTP API benchmark: SSE token latency against the store's own follower, 200 subscribers on one
session, and a prompt's round trip over HTTP against the SDK.

Run from the project root: ``.venv/bin/python bench/api.py`` (``make bench`` runs it too).

One run starts its own in-memory Temporal dev server (the venv's ``temporal`` binary; nothing is
downloaded), and for each database (a SQLite file in a temporary directory; PostgreSQL at
``SESSIONFLOW_BENCH_POSTGRES_URL``, default ``postgresql+psycopg://root@127.0.0.1:5432/test``,
in a fresh schema, skipped with a note when unreachable) an in-process worker, the API on a free
loopback port (``running_api``, as ``sessionflow serve`` runs it) and a store follower
(``EventStore.log(follow=True)``, what the API's shared feed runs). It measures:

1. provider token -> SSE client: a provider wrapper stamps each text delta as the scripted model
   yields it (``time.time()``); an SSE client in a separate process (so its parsing does not
   share the server's event loop; a bare socket per stream, stamping what it reads as it comes
   off the connection and parsing it afterwards) stamps each ``session.text.delta``; a token's
   latency is the arrival of the first event whose text reaches the token's end. The in-process
   store follower is stamped the same way, on the same tokens: the difference is the API's
   cost. Both include the turn's delta batching (``batch_ms``, 30 ms).
2. 200 concurrent subscribers on one session (one client process, one connection each): every
   one must receive every event (its seq list equals the store's), and their token latency is
   printed next to the single subscriber's and the follower's in the same run, with the
   server's own share: from a batch entering the session's feed to each subscriber's write of
   it returning (``WriteClock``).
3. prompt round trip: ``POST /sessions/{id}/prompt`` (admit + wake) over a kept-alive
   connection against ``SessionClient.prompt``, alternating, the session idle before each; and,
   for scale, a read that needs no Temporal call (``GET /sessions/{id}`` against ``session()``).

The API, the worker and the follower share one process and event loop here, as in
``sessionflow dev``: with 200 subscribers every commit of the turn costs 200 sends in the loop
the turn itself runs in, so the turn's 30 ms batches shrink towards one token each and the
follower's latency rises too. CPU seconds of both processes are printed to show where the time
goes. ``sessionflow serve`` beside separate workers does not share its loop with the turns.
``--loop``/``--http`` pick the event loop and uvicorn's protocol (default: what ``serve`` uses,
uvloop and httptools when installed; ``--loop asyncio --http h11`` for the plain stack).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script, this file's directory comes first on sys.path, where ``bench/store.py`` would
# shadow the ``store`` package: put the project root there instead.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

import httpx  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"
Marks = list[tuple[int, float]]  # (text length so far, epoch seconds)
TERMINALS = {
    "session.execution.succeeded",
    "session.execution.failed",
    "session.execution.interrupted",
}
TERMINAL_BYTES = [f'"type": "{name}"'.encode() for name in TERMINALS]


# --- the subscriber process -----------------------------------------------------------------------


async def subscribe(url: str, sid: str, count: int) -> None:
    """``count`` SSE streams of ``sid``: prints ``ready`` once all are synced, then, once each
    saw its busy period's terminal event, one JSON line: their seqs and text-delta arrivals.

    Each stream is a bare socket that stamps what it reads as it comes off the connection and
    parses only once the stream is over. With 200 streams in one process, an HTTP client library
    parsing each stream's batch before the next stream gets to read measured this process's own
    queue (about 40 us per stream and batch, on cores the server shares), not the server's.
    """
    synced = asyncio.Event()
    ready: list[int] = []
    host, port = url.removeprefix("http://").rsplit(":", 1)
    request = (
        f"GET /sessions/{sid}/events HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()

    async def one() -> dict[str, Any]:
        reads: list[tuple[float, bytes]] = []
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        writer.write(request)
        tail = b""
        while chunk := await reader.read(1 << 20):
            reads.append((time.time(), chunk))
            seen, tail = tail + chunk, chunk[-64:]
            if not synced.is_set() and b"event: synced" in seen:
                ready.append(1)
                if len(ready) == count:
                    synced.set()
            if any(name in seen for name in TERMINAL_BYTES):
                break  # the busy period is over (the prompt comes after "ready")
        writer.close()
        return parsed(reads)

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await synced.wait()
    print("ready", flush=True)
    results = await asyncio.gather(*tasks)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"streams": results, "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)


def parsed(reads: list[tuple[float, bytes]]) -> dict[str, Any]:
    """A stream's stored events as seqs and text-delta arrivals: each server write (one HTTP
    chunk) arrived with the read that brought its last byte."""
    raw = b"".join(chunk for _, chunk in reads)
    ends = list(itertools.accumulate(len(chunk) for _, chunk in reads))
    seqs: list[int] = []
    marks: Marks = []
    text, at = 0, raw.index(b"\r\n\r\n") + 4  # past the response head
    while (eol := raw.find(b"\r\n", at)) > 0:
        size = int(raw[at:eol].split(b";")[0], 16)
        body, at = raw[eol + 2 : eol + 2 + size], eol + 2 + size + 2
        if len(body) < size or size == 0:
            break
        arrived = reads[bisect.bisect_right(ends, eol + 1 + size)][0]
        for frame in body.split(b"\r\n\r\n"):
            fields = dict(line.split(b": ", 1) for line in frame.split(b"\r\n") if b": " in line)
            if b"data" not in fields or b"event" in fields:
                continue  # a comment, the synced marker or another named event
            data = json.loads(fields[b"data"])
            seqs.append(data["seq"])
            if data["type"] == "session.text.delta":
                text += len(data["data"]["delta"])
                marks.append((text, arrived))
            elif data["type"] in TERMINALS:
                return {"seqs": seqs, "marks": marks}
    return {"seqs": seqs, "marks": marks}


# --- measurement ----------------------------------------------------------------------------------


def latencies(tokens: Marks, arrivals: Marks) -> list[float]:
    """Per token, ms from the provider yielding it to the first arrival that reaches it."""
    reached = [length for length, _ in arrivals]
    out = []
    for end, emitted in tokens:
        index = bisect.bisect_left(reached, end)
        if index < len(arrivals):
            out.append((arrivals[index][1] - emitted) * 1000)
    return out


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def line(name: str, values: Sequence[float]) -> str:
    if not values:
        return f"  {name:<34} (no samples)"
    return (
        f"  {name:<34} p50 {pct(values, 0.5):7.1f} ms   p99 {pct(values, 0.99):7.1f} ms"
        f"   ({len(values)} samples)"
    )


@dataclass
class Bench:
    """One database's stack: the worker's token marks, the SDK client, the API's URL."""

    root: Path
    client: Any  # SessionClient
    url: str
    tokens: dict[str, Marks] = field(default_factory=dict)

    def script(self, turns: list[list[dict[str, Any]]]) -> str:
        path = self.root / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps({"turns": [{"events": events} for events in turns]}))
        return f"scripted/{path}"

    async def session(self, turns: list[list[dict[str, Any]]]) -> str:
        workspace = self.root / "workspace"
        workspace.mkdir(exist_ok=True)
        sid: str = await self.client.create_session(
            workspace=str(workspace), model=self.script(turns)
        )
        return sid


def streaming_turn(tokens: int, delay_ms: int) -> list[dict[str, Any]]:
    text = "".join(f"tok{i:04d} " for i in range(tokens))
    return [{"text": text, "chunks": tokens, "delay_ms": delay_ms}]


async def follow(bench: Bench, sid: str, marks: Marks, synced: asyncio.Event) -> None:
    """The store's own follower, stamped like the SSE clients, until the busy period ends."""
    text = 0
    async for item in bench.client.store.events.log(sid, follow=True):
        kind = getattr(getattr(item, "data", None), "type", "")
        if item.type == "log.synced":
            synced.set()
        elif kind == "session.text.delta":
            text += len(item.data.delta)
            marks.append((text, time.time()))
        elif kind in TERMINALS:
            return


@dataclass
class Watched:
    streams: list[dict[str, Any]]  # per SSE client: seqs, text-delta arrivals
    follower: Marks
    sid: str
    client_cpu_s: float  # the client process's CPU time
    server_cpu_s: float  # this process's (API, worker, follower) while the turn ran
    seconds: float


async def watched_turn(bench: Bench, count: int, tokens: int) -> Watched:
    """One streaming turn watched by ``count`` SSE clients in a child process and the follower."""
    sid = await bench.session([streaming_turn(tokens, 5)])
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "subscribe",
        bench.url,
        sid,
        str(count),
        stdout=asyncio.subprocess.PIPE,
        limit=1 << 30,
    )
    assert child.stdout is not None
    assert (await child.stdout.readline()).strip() == b"ready"
    marks: Marks = []
    synced = asyncio.Event()
    follower = asyncio.create_task(follow(bench, sid, marks, synced))
    await synced.wait()
    cpu, began = time.process_time(), time.perf_counter()
    await bench.client.prompt(sid, "go")
    results = json.loads(await child.stdout.readline())
    await child.wait()
    await follower
    return Watched(
        results["streams"],
        marks,
        sid,
        results["cpu_s"],
        time.process_time() - cpu,
        time.perf_counter() - began,
    )


async def token_latency(bench: Bench, sessions: int) -> None:
    sse: list[float] = []
    store: list[float] = []
    for _ in range(sessions):
        watched = await watched_turn(bench, 1, 200)
        tokens = bench.tokens[watched.sid]
        sse += latencies(tokens, [tuple(m) for m in watched.streams[0]["marks"]])
        store += latencies(tokens, watched.follower)
    print("provider token -> client, 1 SSE subscriber:")
    print(line("SSE client (HTTP, other process)", sse))
    print(line("store follower (in process)", store))


class WriteClock:
    """The server's own share, with no client in it: per subscriber and live batch, ms from the
    batch's last frame entering the session's feed to that subscriber's write of it returning
    (the bytes are in its socket then). Wraps the feed's methods while it is installed."""

    def __init__(self) -> None:
        self.ms: list[float] = []

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from sessionflow.api.feed import Feed

        added: dict[int, float] = {}
        add, frames = Feed._add, Feed.frames

        def timed_add(feed: Feed, frame: Any) -> None:
            added[frame.seq] = time.perf_counter()
            add(feed, frame)

        async def timed_frames(feed: Feed, after: int, through: int | None = None) -> Any:
            async for batch in frames(feed, after, through):
                yield batch  # returns once the subscriber's write of it returned
                if through is None and batch[-1].seq in added:
                    self.ms.append((time.perf_counter() - added[batch[-1].seq]) * 1000)

        Feed._add, Feed.frames = timed_add, timed_frames  # type: ignore[method-assign]
        try:
            yield
        finally:
            Feed._add, Feed.frames = add, frames  # type: ignore[method-assign]


async def fan_out(bench: Bench, count: int) -> None:
    clock = WriteClock()
    with clock.installed():
        watched = await watched_turn(bench, count, 200)
    tokens = bench.tokens[watched.sid]
    expected = [event.seq async for event in bench.client.events(watched.sid)]
    complete = sum(1 for stream in watched.streams if stream["seqs"] == expected)
    sse = [
        value
        for stream in watched.streams
        for value in latencies(tokens, [tuple(m) for m in stream["marks"]])
    ]
    print(f"{count} concurrent SSE subscribers on one session ({len(expected)} events):")
    print(f"  every event, in order, no repeat:  {complete}/{count} subscribers")
    print(line(f"SSE clients ({count}, one process)", sse))
    print(line("server: feed -> socket write", clock.ms))
    print(line("store follower (in process)", latencies(tokens, watched.follower)))
    print(
        f"  CPU over the {watched.seconds:.1f} s turn: server process (API, worker, follower) "
        f"{watched.server_cpu_s:.1f} s, client process {watched.client_cpu_s:.1f} s"
    )


async def prompt_round_trip(bench: Bench, rounds: int) -> None:
    sid = await bench.session([[{"text": "ok"}] for _ in range(2 * rounds + 2)])
    http_ms: list[float] = []
    sdk_ms: list[float] = []
    async with httpx.AsyncClient(base_url=bench.url, timeout=60) as http:
        await http.get("/healthz")  # the connection is open before the first measurement
        for i in range(rounds):
            await bench.client.wait_idle(sid)
            began = time.perf_counter()
            answer = await http.post(f"/sessions/{sid}/prompt", json={"text": f"http {i}"})
            http_ms.append((time.perf_counter() - began) * 1000)
            assert answer.status_code == 200, answer.text
            await bench.client.wait_idle(sid)
            began = time.perf_counter()
            await bench.client.prompt(sid, f"sdk {i}")
            sdk_ms.append((time.perf_counter() - began) * 1000)
        await bench.client.wait_idle(sid)
        read_http, read_sdk = await reads(bench, http, sid, rounds)
    print(f"prompt round trip (admit + wake), {rounds} each, alternating:")
    print(line("HTTP POST .../prompt", http_ms))
    print(line("SDK SessionClient.prompt", sdk_ms))
    ratio = statistics.median(http_ms) / statistics.median(sdk_ms)
    print(f"  HTTP / SDK median: {ratio:.2f}x")
    print("for scale, a read with no Temporal call (GET /sessions/{id} against .session()):")
    print(line("HTTP GET /sessions/{id}", read_http))
    print(line("SDK SessionClient.session", read_sdk))


async def reads(
    bench: Bench, http: httpx.AsyncClient, sid: str, rounds: int
) -> tuple[list[float], list[float]]:
    http_ms: list[float] = []
    sdk_ms: list[float] = []
    for _ in range(rounds):
        began = time.perf_counter()
        assert (await http.get(f"/sessions/{sid}")).status_code == 200
        http_ms.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        await bench.client.session(sid)
        sdk_ms.append((time.perf_counter() - began) * 1000)
    return http_ms, sdk_ms


# --- the stack ------------------------------------------------------------------------------------


class TimedProvider:
    """Stamps each text delta as the model yields it, then passes it on."""

    def __init__(self, inner: Any, tokens: dict[str, Marks]) -> None:
        self.inner, self.tokens = inner, tokens

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        marks = self.tokens.setdefault(request.session_id, [])
        text = marks[-1][0] if marks else 0
        async for event in self.inner.stream(request):
            if event.kind == "text-delta":
                text += len(event.delta)
                marks.append((text, time.time()))
            yield event


async def run_database(
    env: Any, url: str, label: str, args: argparse.Namespace, *, schema: str | None = None
) -> None:
    from activities.providers.scripted import ScriptedProvider
    from sessionflow.api.config import ApiSettings
    from sessionflow.api.serve import running_api
    from sessionflow.client import SessionClient
    from sessionflow.settings import Settings
    from store import open_store
    from worker import build_worker

    tokens: dict[str, Marks] = {}
    with tempfile.TemporaryDirectory(prefix="sessionflow-api-bench-") as directory:
        root = Path(directory)
        url = url or f"sqlite+aiosqlite:///{root / 'sessionflow.db'}"
        store = await open_store(url, schema=schema, settings=Settings(database_url=url))
        try:
            client = SessionClient(env.client, store, task_queue=f"bench-{uuid.uuid4()}")

            def providers(model: Any) -> Any:
                return TimedProvider(ScriptedProvider(model.id, record=False), tokens)

            worker = build_worker(
                env.client, store, task_queue=client.task_queue, providers=providers
            )
            api = running_api(client, ApiSettings(port=0), http=args.http)
            async with worker, api as api_url:
                bench = Bench(root, client, api_url, tokens)
                print(f"\n== {label} ==")
                await watched_turn(bench, 1, 20)  # warm-up, unmeasured
                if args.latency_sessions:
                    await token_latency(bench, args.latency_sessions)
                if args.subscribers:
                    await fan_out(bench, args.subscribers)
                if args.prompts:
                    await prompt_round_trip(bench, args.prompts)
        finally:
            await store.close()


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


async def reachable(url: str) -> bool:
    import psycopg

    try:
        async with await psycopg.AsyncConnection.connect(_libpq(url), connect_timeout=5):
            return True
    except psycopg.Error as error:
        print(f"\n== PostgreSQL == skipped: {url} cannot be reached ({error})")
        return False


async def drop_schema(url: str, schema: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(_libpq(url), autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def main(args: argparse.Namespace) -> None:

    from bench.drain import dev_server

    began = time.perf_counter()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus; dev server (in-memory)")
    env = await dev_server()
    try:
        if args.database in ("all", "sqlite"):
            await run_database(env, "", "SQLite", args)
        pg = os.environ.get("SESSIONFLOW_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_URL)
        if args.database in ("all", "postgresql") and await reachable(pg):
            schema = f"api_bench_{uuid.uuid4().hex[:12]}"
            try:
                await run_database(env, pg, "PostgreSQL (fresh schema)", args, schema=schema)
            finally:
                await drop_schema(pg, schema)
    finally:
        await env.shutdown()
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The HTTP API: SSE latency, fan-out, prompts.")
    parser.add_argument("--database", choices=["all", "sqlite", "postgresql"], default="all")
    parser.add_argument("--latency-sessions", type=int, default=3, help="turns of 200 tokens")
    parser.add_argument("--subscribers", type=int, default=200, help="on one session")
    parser.add_argument("--prompts", type=int, default=30, help="round trips of each kind")
    parser.add_argument(
        "--loop",
        choices=["auto", "asyncio"],
        default="auto",
        help="auto: the loop sessionflow serve runs in (uvloop when installed)",
    )
    parser.add_argument(
        "--http",
        choices=["auto", "h11", "httptools"],
        default="auto",
        help="uvicorn's HTTP protocol (auto: httptools when installed, as sessionflow serve)",
    )
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> None:
    from sessionflow.api.serve import event_loop

    factory = event_loop() if args.loop == "auto" else None
    print(f"event loop: {'uvloop' if factory else 'asyncio'}, HTTP protocol: {args.http}")
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main(args))


if __name__ == "__main__":
    if sys.argv[1:2] == ["subscribe"]:
        try:
            import uvloop  # a cheaper client, when installed

            factory: Any = uvloop.new_event_loop
        except ImportError:
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(subscribe(sys.argv[2], sys.argv[3], int(sys.argv[4])))
    else:
        run(parse_args())
        from sessionflow.cli import leave

        leave(0)  # the Temporal runtime can crash a finalizing interpreter (PyGILState_Release)
