"""Workers in their own processes, for the tests that kill, pause or stop them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from tests.conftest import Target


class WorkerProcess:
    def __init__(self, env: WorkflowEnvironment, target: Target, task_queue: str, **env_vars: str):
        address = env.client.service_client.config.target_host
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
            env={**os.environ, **env_vars},
            cwd=Path(__file__).parents[2],
        )

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

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
