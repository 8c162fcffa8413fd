"""Workers in their own processes, for the tests that kill, pause or stop them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import Target


class WorkerProcess:
    """``own_group``: the worker leads a process group of its own (as under a service manager),
    so that ``signal_group`` can kill the whole group without hitting the test. ``address``:
    the Temporal server's, if not the test environment's (a link the test can hold);
    ``log``: a file for the worker's stderr (its warnings), instead of the test's."""

    def __init__(
        self,
        env: WorkflowEnvironment,
        target: Target,
        task_queue: str,
        *,
        own_group: bool = False,
        address: str | None = None,
        log: str | None = None,
        **env_vars: str,
    ):
        address = address or env.client.service_client.config.target_host
        stderr = open(log, "wb") if log is not None else None  # noqa: SIM115 -- closed below
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.workflows.worker_proc",
                address,
                task_queue,
                target.url,
                target.schema or "-",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **env_vars},
            cwd=Path(__file__).parents[2],
            start_new_session=own_group,
        )
        if stderr is not None:
            stderr.close()  # the worker holds its own descriptor
        self.own_group = own_group

    async def ready(self) -> None:
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 60)
        except TimeoutError:
            self.stop()
            raise AssertionError("the worker process did not report ready within 60 s") from None
        assert line.strip() == b"ready", line

    async def exited(self) -> int:
        """Wait for the process to end by itself (after a SIGTERM, say); its exit code."""
        return await asyncio.to_thread(self.process.wait, 60)

    def signal(self, sig: int) -> None:
        os.kill(self.process.pid, sig)

    def signal_group(self, sig: int) -> None:
        assert self.own_group, "the worker shares the test's process group"
        os.killpg(self.process.pid, sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def live_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def sleep_marker() -> str:
    """A ``sleep`` argument no other process on the host uses, to find the tool's process."""
    return f"{uuid.uuid4().int % 900 + 1000}.{uuid.uuid4().int % 1000}"


def recorded_in(root: Path, pids: list[int]) -> list[int]:
    """The process groups of ``pids`` that a worker recorded (``SESSIONFLOW_PROCESS_DIR=root``)."""
    directory = root / f"sessionflow-processes-{os.getuid()}-local"  # the local host's
    groups = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    return sorted(g for g in groups if (directory / str(g)).exists())


@contextlib.asynccontextmanager
async def outside_a_write(target: Target) -> AsyncIterator[None]:
    """On SQLite, hold the file's write lock meanwhile: a worker stopped inside a write would
    keep the lock, and with it every other writer out (the takeover included), until it
    resumes. The worker may be stopped waiting for the lock, holding nothing. PostgreSQL's
    server ends a stopped client's transaction itself (its idle bound, lease / 2)."""
    if target.backend != "sqlite":
        yield
        return
    path = target.url.removeprefix("sqlite+aiosqlite:///")
    connect = partial(sqlite3.connect, timeout=30, isolation_level=None, check_same_thread=False)
    lock = await asyncio.to_thread(connect, path)
    try:
        await asyncio.to_thread(lock.execute, "BEGIN IMMEDIATE")
        yield
        lock.execute("ROLLBACK")
    finally:
        lock.close()
