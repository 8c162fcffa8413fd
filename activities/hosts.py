"""Hosts: the lease a host's worker renews, what it offers, and the activities about hosts.

A worker started for a host (``SESSIONFLOW_HOST``) serves that host's tools on its own task
queue (``tool_queue``); while it runs, ``HostLease`` renews its row in the store every lease/3
(``store/hosts.py``), offering its tools to turns that run on workers of other hosts
(``offered_tools``). ``check_workspace`` runs on the host's queue and checks a workspace where it
lives; ``host_state`` runs anywhere and reads a host's leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from temporalio import activity

from activities import context
from activities.runtime import Runtime, translated
from activities.tools.base import ToolRegistry
from activities.tools.offered import catalog
from sessionflow.errors import InvalidInputError
from sessionflow.models.drain import (
    HostStateInput,
    HostStateResult,
    WorkspaceCheckInput,
    WorkspaceCheckResult,
)
from sessionflow.validate import workspace as checked_workspace
from store import Store

log = logging.getLogger(__name__)


def version() -> str:
    try:
        return metadata.version("sessionflow")
    except metadata.PackageNotFoundError:
        return "dev"


def check_directory(host: str, directory: str, tools: ToolRegistry) -> WorkspaceCheckResult:
    """``directory`` checked and made absolute here, with the instruction files it holds."""
    try:
        path = checked_workspace(directory)
    except InvalidInputError as error:
        return WorkspaceCheckResult(host=host, error=f"{error} (on host {host})")
    return WorkspaceCheckResult(host=host, directory=path, instructions=instructions(path, tools))


def instructions(directory: str, tools: ToolRegistry) -> dict[str, str]:
    """The workspace's instruction file as the tools' confinement reads it ({} if none)."""
    try:
        found = context.instruction_file(directory, context.tool_settings(tools))
    except context.Unobservable:
        return {}
    return {found[0]: found[1]} if found is not None else {}


class HostActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    @activity.defn
    async def check_workspace(self, request: WorkspaceCheckInput) -> WorkspaceCheckResult:
        """On the host's own queue: is the workspace there, and what does it say."""
        host = self.rt.host or "?"
        if not Path(request.directory).is_absolute():
            error = f"Workspace {request.directory} must be an absolute path on host {host}"
            return WorkspaceCheckResult(host=host, error=error)
        return await asyncio.to_thread(check_directory, host, request.directory, self.rt.tools)

    @activity.defn
    async def host_state(self, request: HostStateInput) -> HostStateResult:
        async with translated():
            state = await self.rt.store.hosts.state(request.host)
        return HostStateResult(
            host=request.host, status=state.status, ever=state.ever, seen_ms_ago=state.seen_ms_ago
        )


class HostLease:
    """This worker's lease on its host, renewed every lease/3 while it serves (an async
    context manager). The first renewal happens before the worker polls: a session placed on
    the host finds it live from the start. A renewal that fails (a database outage) is
    logged and tried again; the lease runs out only if the outage outlasts it."""

    def __init__(self, store: Store, host: str, worker: str, task_queue: str, tools: ToolRegistry):
        self.store, self.host, self.worker, self.task_queue = store, host, worker, task_queue
        self.tools = tools
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HostLease:
        await self._renew(catalog(self.tools))
        self._task = asyncio.create_task(self._forever())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self.store.hosts.withdraw(self.host, self.worker)
        except Exception as failed:  # its lease runs out by itself
            log.warning(
                "host %s: could not withdraw the lease of %s: %s", self.host, self.worker, failed
            )

    async def _forever(self) -> None:
        every = self.store.hosts.lease_ms / 3000
        while True:
            await asyncio.sleep(every)
            try:
                await self._renew(None)
            except Exception as failed:
                log.warning("host %s: lease renewal failed, retrying: %s", self.host, failed)

    async def _renew(self, tools: list[dict[str, Any]] | None) -> None:
        await self.store.hosts.renew(
            self.host, self.worker, task_queue=self.task_queue, version=version(), tools=tools
        )
