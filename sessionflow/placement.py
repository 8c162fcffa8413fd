"""Placing a session on a host: the host's leases say whether it exists and runs, and the host
itself checks the workspace where it lives (a ``WorkspaceCheck`` run on its queue).

The ``local`` host is the one of workers started without a host name, on the caller's machine
in the embedded default: its workspace is checked here, as before hosts existed, and a session
may be placed on it before any worker runs (its prompt waits for one).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import timedelta

from temporalio.client import Client, WorkflowFailureError

from sessionflow import validate
from sessionflow.errors import HostUnavailableError, InvalidInputError, UnknownHostError
from sessionflow.ids import validate_host
from sessionflow.models.drain import (
    LOCAL_HOST,
    WorkspaceCheckInput,
    WorkspaceCheckResult,
    tool_queue,
)
from store import Store

# How long a host's worker may take to check a workspace before the caller is told.
CHECK_TIMEOUT = timedelta(seconds=10)


@dataclass(frozen=True)
class Placement:
    host: str
    directory: str
    observed: dict[str, str] | None = None  # the instruction files, as the host read them


async def place(
    temporal: Client, store: Store, task_queue: str, host: str, workspace: str
) -> Placement:
    """Where a session's tools will run: ``host``, with ``workspace`` checked there.

    ``UnknownHostError`` for a host that never registered, ``HostUnavailableError`` for one
    whose workers are gone or did not answer, ``InvalidInputError`` for a workspace the host
    does not have."""
    validate_host(host)
    if host == LOCAL_HOST:
        return Placement(host, validate.workspace(workspace))
    state = await store.hosts.state(host)
    if not state.ever:
        known = sorted({worker.host for worker in await store.hosts.workers()})
        raise UnknownHostError(host, known)
    if not state.live:
        ago = (state.seen_ms_ago or 0) / 1000
        raise HostUnavailableError(host, f"none of its workers was seen for {ago:.0f} s")
    if not workspace.startswith("/"):
        raise InvalidInputError(
            f"Workspace {workspace} must be an absolute path on host {host}: a relative path "
            "names a directory of this machine, not of that host",
            field="workspace",
        )
    checked = await _check(temporal, task_queue, host, workspace)
    if checked.directory is None:
        raise InvalidInputError(
            checked.error or f"Workspace {workspace} failed its check on {host}"
        )
    return Placement(host, checked.directory, checked.instructions)


async def _check(
    temporal: Client, task_queue: str, host: str, workspace: str
) -> WorkspaceCheckResult:
    handle = await temporal.start_workflow(
        "WorkspaceCheck",
        WorkspaceCheckInput(directory=workspace),
        id=f"workspace-check-{uuid.uuid4().hex}",
        task_queue=tool_queue(task_queue, host),
        execution_timeout=CHECK_TIMEOUT,
        result_type=WorkspaceCheckResult,
    )
    try:
        async with asyncio.timeout(CHECK_TIMEOUT.total_seconds() + 1):
            result: WorkspaceCheckResult = await handle.result()
            return result
    except (TimeoutError, WorkflowFailureError):
        seconds = CHECK_TIMEOUT.total_seconds()
        raise HostUnavailableError(
            host, f"no worker of it checked the workspace within {seconds:.0f} s"
        ) from None
