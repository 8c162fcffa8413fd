"""Build and run the sessionflow worker: ``python worker.py``.

Environment: ``SESSIONFLOW_DATABASE_URL`` (default ``sessionflow.db`` in the nearest
``.sessionflow/`` upward, see ``sessionflow/locate.py``),
``SESSIONFLOW_TEMPORAL_ADDRESS`` (default ``127.0.0.1:7233``), ``SESSIONFLOW_TASK_QUEUE``
(default ``sessionflow``), ``SESSIONFLOW_NAMESPACE`` (default ``default``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.capacity import Capacity
from activities.compact import CompactionActivities
from activities.fork import ForkActivities
from activities.hosts import HostActivities, HostLease
from activities.runtime import ProviderFactory, Runtime, default_providers
from activities.session import SessionActivities
from activities.sweep import SweepActivities
from activities.tool_run import ToolActivities
from activities.tools.base import ToolRegistry
from activities.tools.builtin import default_registry
from activities.tools.mcp import McpPool
from activities.tools.mcp_config import McpConfigError, load_config
from activities.tools.plugins import PluginError, entry_point_tools, load_entry, register_all
from activities.tools.process import kill_running, reap_orphans
from activities.tools.sandbox import describe as describe_sandbox
from activities.tools.settings import ToolSettings, database_paths, platform_protected
from activities.tools.task import DEFAULT_MAX_DEPTH
from activities.tools.testing import testing_registry
from activities.turn import TurnActivities
from sessionflow import locate, telemetry
from sessionflow.agents import Agents, load_agents
from sessionflow.devstack import ensure_search_attribute
from sessionflow.logs import quiet_expected_failures
from sessionflow.models.drain import (
    LOCAL_HOST,
    TASK_QUEUE,
    SweepInput,
    sweep_schedule_id,
    tool_queue,
)
from sessionflow.settings import Settings
from store import Store, open_store
from store.blobs import Retention
from workflows.hosts import WorkspaceCheck
from workflows.session import SessionWorkflow
from workflows.sweep import RecoverySweep

log = logging.getLogger("sessionflow.worker")


async def connect_patiently(address: str, namespace: str, *, seconds: float = 120) -> Client:
    """Connect, waiting for a Temporal server that is still starting (a cluster coming up)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await connect(address, namespace)
        except RuntimeError as error:
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit(f"No Temporal server at {address}: {error}") from None
            log.info("waiting for Temporal at %s: %s", address, error)
            await asyncio.sleep(2)


def tools_from_env(settings: Settings | None = None) -> ToolRegistry:
    """``SESSIONFLOW_TOOLS``: comma-separated, ``builtin`` (the default: read, write, edit,
    list, glob, grep, bash, question), ``testing`` (echo, sleep, fail, defect) and
    ``module:attribute`` entries of your own; then every ``sessionflow.tools`` entry point.
    A bad entry stops the worker with one line naming it."""
    loaded: list[tuple[str, Any]] = []
    for choice in (c.strip() for c in os.environ.get("SESSIONFLOW_TOOLS", "builtin").split(",")):
        if choice == "builtin":
            loaded += [("built-in", tool) for tool in builtin_tools(settings)]
        elif choice == "testing":
            loaded += [("testing", tool) for tool in testing_registry().tools()]
        elif ":" in choice:
            loaded += [(f"plugin {choice}", tool) for tool in _plugin(choice)]
        elif choice:
            raise SystemExit(
                f"SESSIONFLOW_TOOLS={choice!r}: use builtin, testing or module:attribute entries"
            )
    try:
        return register_all(ToolRegistry(), [*loaded, *entry_point_tools()])
    except PluginError as error:
        raise SystemExit(f"SESSIONFLOW_TOOLS: {error}") from None


def mcp_from_env(settings: Settings | None = None) -> McpPool | None:
    """The MCP servers ``SESSIONFLOW_MCP`` configures (a JSON file), or None without it. A
    configuration that cannot be used stops the worker with one line naming the fault."""
    path = os.environ.get("SESSIONFLOW_MCP")
    if not path:
        return None
    try:
        config = load_config(path)
    except McpConfigError as error:
        raise SystemExit(str(error)) from None
    return McpPool(config, tool_settings(settings or Settings.from_env()))


def _plugin(entry: str) -> list[Any]:
    try:
        return list(load_entry(entry))
    except PluginError as error:
        raise SystemExit(f"SESSIONFLOW_TOOLS: {error}") from None


def builtin_tools(settings: Settings | None = None) -> list[Any]:
    """The built-ins, protecting the store's own SQLite files wherever they are."""
    return default_registry(tool_settings(settings or Settings.from_env())).tools()


def retention(settings: Settings) -> Retention:
    """The journal's retention as the settings say (0: no such bound)."""
    days, total = settings.journal_keep_days, settings.journal_max_total_bytes
    return Retention(unnamed_ms=int(days * 86_400_000) or None, max_bytes=total or None)


def tool_settings(settings: Settings) -> ToolSettings:
    """The built-ins' settings: the store's own SQLite files protected wherever they are, and
    the shell sandbox as the worker's settings say."""
    return ToolSettings(
        protected_paths=(*platform_protected(), *database_paths(settings.database_url)),
        sandbox=settings.sandbox,
        sandbox_mount=settings.sandbox_mount,
        sandbox_hide=settings.sandbox_hide,
        journal_max_bytes=settings.journal_max_bytes,
    )


def demo_tools(settings: Settings | None = None) -> ToolRegistry:
    return ToolRegistry(builtin_tools(settings))


def identity() -> str:
    return f"{socket.gethostname()}/{os.getpid()}"


async def connect(address: str, namespace: str = "default") -> Client:
    return await Client.connect(
        address,
        namespace=namespace,
        data_converter=pydantic_data_converter,
        identity=identity(),
        interceptors=telemetry.interceptors(),
    )


def activities_for(runtime: Runtime, task_queue: str) -> Sequence[Any]:
    session, turn, tools = (
        SessionActivities(runtime),
        TurnActivities(runtime),
        ToolActivities(runtime),
    )
    hosts = HostActivities(runtime)
    return [
        hosts.host_state,
        tools.host_unreachable,
        SweepActivities(runtime, task_queue=task_queue).sweep_recoverable,
        session.acquire_claim,
        session.claim_and_prepare,
        session.finish_execution,
        session.stored_outcome,
        session.prepare_drain,
        session.pending_inputs,
        session.finish_step,
        turn.stream_turn,
        CompactionActivities(runtime).compact,
        tools.run_tool,
        *_rewind(ForkActivities(runtime)),
    ]


def _rewind(rewind: ForkActivities) -> list[Callable[..., Any]]:
    return [rewind.revert_workspace, rewind.fork_workspace]


def build_worker(
    client: Client,
    store: Store,
    *,
    task_queue: str = TASK_QUEUE,
    tools: ToolRegistry | None = None,
    providers: ProviderFactory = default_providers,
    graceful_shutdown: timedelta = timedelta(seconds=15),
    sandboxed: bool = False,
    max_concurrent_activities: int = 1000,
    turn_timeout_s: int = 3600,
    claim_wait_s: int = 3600,
    retry_backoff_ms: int = 2000,
    batch_ms: int = 30,
    agents: Agents | None = None,
    mcp: McpPool | None = None,
    max_depth: int = DEFAULT_MAX_DEPTH,
    host: str = LOCAL_HOST,
    serve: str = "all",
    capacity: Capacity | None = None,
    retention: Retention | None = None,
) -> SessionWorker:
    """The worker with the defaults of DESIGN "Worker defaults".

    ``sandboxed`` runs the workflows in Temporal's sandbox, which turns a non-deterministic call
    in workflow code into a failed workflow task. The workflows are this project's own, and the
    test suite runs every one of them there (as does the replay test), so a worker runs them
    unsandboxed by default: in temporalio 1.35 the sandbox re-enters itself for every payload
    of every activation, about 0.7 ms of event-loop time each, a fifth of a busy worker's
    throughput (``bench/drain.py``). ``SESSIONFLOW_WORKFLOW_SANDBOX=true`` turns it back on.

    ``max_concurrent_activities`` bounds the model turns and tool calls running at once. They
    are coroutines that mostly wait (on a model stream, on a tool's process), so the bound is
    far above the SDK's 100: at 100, fifty busy sessions fill every slot, and then the server
    cannot hand a workflow task's new activities straight back to this worker (eager start)
    and routes each through its task queue instead -- another poll, dispatch and persistence
    round per activity. ``max_active_tools`` still caps each session's own tools.

    ``host`` and ``serve`` say what it serves (``sessionflow/settings.py``): a named host's
    tools run on a second Temporal worker polling ``<task queue>@<host>``, and every worker
    that runs tools renews its host's lease in the store while it runs (``HostLease``).
    """
    if serve not in ("all", "turns", "tools"):
        raise ValueError(f"serve must be all, turns or tools, got {serve!r}")
    if serve == "tools" and host == LOCAL_HOST:
        raise ValueError(
            "a tools-only worker needs a host name (SESSIONFLOW_HOST or --host): the local "
            "host's tools run on the shared queue, with the turns"
        )
    runtime = Runtime(
        store=store,
        tools=tools or default_registry(),
        providers=providers,
        turn_timeout_s=turn_timeout_s,
        claim_wait_s=claim_wait_s,
        retry_backoff_ms=retry_backoff_ms,
        batch_ms=batch_ms,
        agents=agents or Agents(),
        mcp=mcp,
        max_depth=max_depth,
        host=None if serve == "turns" else host,
        capacity=capacity or Capacity.from_env(),
        retention=retention or Retention(),
    )
    runner = SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner()
    common: dict[str, Any] = {
        "max_heartbeat_throttle_interval": timedelta(milliseconds=250),
        "default_heartbeat_throttle_interval": timedelta(milliseconds=250),
        "graceful_shutdown_timeout": graceful_shutdown,
        "workflow_runner": runner,
        "max_concurrent_activities": max_concurrent_activities,
        # Clients tell which store the workers of a queue serve from their identities (`new`
        # refuses to create a session in a store no worker of its queue writes to).
        "identity": f"{identity()} {locate.identity_suffix(store.db.url, store.db.schema)}",
    }
    workers = []
    if serve != "tools":
        workers.append(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[SessionWorkflow, RecoverySweep],
                activities=activities_for(runtime, task_queue),
                sticky_queue_schedule_to_start_timeout=timedelta(seconds=2),
                **common,
            )
        )
    lease = None
    if serve != "turns":
        queue = tool_queue(task_queue, host)
        if host != LOCAL_HOST:
            tools_worker, checks = ToolActivities(runtime), HostActivities(runtime)
            rewind = ForkActivities(runtime)
            workers.append(
                Worker(
                    client,
                    task_queue=queue,
                    workflows=[WorkspaceCheck],
                    activities=[
                        tools_worker.run_tool,
                        checks.check_workspace,
                        *_rewind(rewind),
                    ],
                    **common,
                )
            )
        lease = HostLease(store, host, common["identity"], queue, runtime.tools)
    return SessionWorker(workers, lease, task_queue=task_queue, host=runtime.host)


class SessionWorker:
    """The Temporal workers of one sessionflow worker (the shared queue's and its host's),
    and its host lease: an async context manager that runs them all."""

    def __init__(
        self,
        workers: list[Worker],
        lease: HostLease | None,
        *,
        task_queue: str,
        host: str | None,
    ) -> None:
        self.workers, self.lease = workers, lease
        self.task_queue, self.host = task_queue, host
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self) -> SessionWorker:
        async with contextlib.AsyncExitStack() as stack:
            if self.lease is not None:  # live before it polls; withdrawn after it stopped
                await stack.enter_async_context(self.lease)
            for worker in self.workers:
                await stack.enter_async_context(worker)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.__aexit__(*exc)


async def ensure_sweep_schedule(
    client: Client,
    *,
    store: Store,
    task_queue: str = TASK_QUEUE,
    every: timedelta = timedelta(seconds=30),
    passes_every: timedelta = timedelta(seconds=3),
) -> str:
    """Create the recovery sweep's Schedule for this deployment, its task queue and store (an
    existing one is kept), running on that queue; returns its id. A namespace holds one per
    deployment: each recovers its own sessions, whoever else shares the namespace."""
    schedule_id = sweep_schedule_id(task_queue, locate.store_key(store.db.url, store.db.schema))
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            "RecoverySweep",
            # Passes every few seconds through the run's interval: a drain an operator
            # terminated is noticed in seconds (its live claim is then taken over at once).
            SweepInput(
                rounds=max(1, int(every / passes_every)),
                every_s=passes_every.total_seconds(),
            ),
            id=schedule_id,
            task_queue=task_queue,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    with contextlib.suppress(ScheduleAlreadyRunningError):
        await client.create_schedule(schedule_id, schedule)
    return schedule_id


def reap_now() -> None:
    """Kill tool process groups left by workers on this host that died without cleaning up."""
    killed = reap_orphans()
    if killed:
        log.warning("killed %d tool process group(s) of dead workers: %s", len(killed), killed)


async def reap_orphans_forever(every: float = 10.0) -> None:
    """``reap_now`` every ``every`` seconds (``serving`` reaped once already)."""
    while True:
        await asyncio.sleep(every)
        reap_now()


@contextlib.asynccontextmanager
async def serving(worker: SessionWorker) -> AsyncIterator[SessionWorker]:
    """Run ``worker`` as a host's worker does: the tool groups of workers that died here (a
    SIGKILL of a whole process group, an OOM kill) are reaped before it polls, and then every
    10 s, so an orphan lives until the next worker on the host starts or passes; on the way
    out what this process still runs is killed (Temporal's cancellation of running tools came
    first)."""
    reap_now()
    reaper = asyncio.create_task(reap_orphans_forever())
    try:
        async with worker:
            yield worker
    finally:
        reaper.cancel()
        kill_running()


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings.from_env()
    telemetry.configure(settings.otel_exporter)
    address = os.environ.get("SESSIONFLOW_TEMPORAL_ADDRESS", "127.0.0.1:7233")
    task_queue = os.environ.get("SESSIONFLOW_TASK_QUEUE", TASK_QUEUE)
    namespace = os.environ.get("SESSIONFLOW_NAMESPACE", "default")
    quiet_expected_failures()
    # Tools first: a bad entry or MCP configuration stops the worker before it connects.
    tools, mcp = tools_from_env(settings), mcp_from_env(settings)
    # The store the CLI finds from here too (the nearest .sessionflow/ upward), by absolute path.
    database_url = locate.database_url(
        os.environ.get("SESSIONFLOW_DATABASE_URL"), address=address, task_queue=task_queue
    )
    store = await open_store(database_url, settings=settings)
    client = await connect_patiently(address, namespace)
    await ensure_search_attribute(client, namespace)
    worker = build_worker(
        client,
        store,
        task_queue=task_queue,
        tools=tools,
        sandboxed=settings.workflow_sandbox,
        max_concurrent_activities=settings.max_concurrent_activities,
        turn_timeout_s=settings.turn_timeout_s,
        claim_wait_s=settings.claim_wait_s,
        retry_backoff_ms=settings.retry_backoff_ms,
        batch_ms=settings.batch_ms,
        agents=load_agents(settings.agents_file),
        mcp=mcp,
        max_depth=settings.max_depth,
        host=settings.host,
        serve=settings.serve,
        retention=retention(settings),
    )
    if settings.serve != "tools":  # a tools-only host runs no workflows of the shared queue
        await ensure_sweep_schedule(client, store=store, task_queue=task_queue)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    shell = describe_sandbox(tool_settings(settings))
    (log.info if settings.sandbox and "unavailable" not in shell else log.warning)(shell)
    serves = {"all": "turns and tools", "turns": "turns only", "tools": "tools only"}
    log.info(
        "worker %s (host %s, %s) polling %s on %s, store %s",
        identity(),
        settings.host,
        serves[settings.serve],
        task_queue,
        address,
        database_url,
    )
    with published(address, task_queue, database_url, kind="worker"):
        async with serving(worker):
            await stop.wait()
            log.info("shutting down")
    if mcp is not None:
        await mcp.close()
    await store.close()


@contextlib.contextmanager
def published(address: str, task_queue: str, database_url: str, *, kind: str) -> Iterator[None]:
    """Record for commands run on this machine that this process serves ``database_url`` to
    ``task_queue`` (``locate``'s running stacks), for as long as it runs."""
    record = locate.StackRecord(address, task_queue, database_url, os.getpid(), kind)
    try:
        path = locate.publish(record)
    except OSError as error:  # a read-only home: commands then find the store as before
        log.warning("cannot record the running stack in %s: %s", locate.directory(), error)
        yield
        return
    try:
        yield
    finally:
        locate.withdraw(path)


if __name__ == "__main__":
    asyncio.run(main())
