"""The CLI with no worker and through a store outage (issue 32): it says what happens, never
goes silent, and rides the outage out; real Temporal, real stores, the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.conftest import Target
from tests.sessionflow.api.test_guard import Proxy
from tests.sessionflow.test_cli import ROOT, Cli, cli_on
from tests.workflows.harness import Harness, call, harness


@pytest.fixture
async def idle_cli(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Cli, Harness]]:
    """The CLI on a queue no worker polls until the test starts one (``h.worker()``)."""
    async with cli_on(temporal_env, tmp_path, start_worker=False) as running:
        yield running


async def test_no_worker_is_said_and_prompts_left_unrun_are_reported(
    idle_cli: tuple[Cli, Harness],
) -> None:
    """``prompt`` said nothing with no worker; after a queued interrupt the prompt stayed
    pending for ever while ``watch --until-idle`` printed nothing and exited 0."""
    run, h = idle_cli
    sid = await h.session([{"text": "hello"}], [{"text": "again"}])
    prompted = await run.run("prompt", sid, "Go", "--json")
    assert prompted.returncode == 0, prompted.stderr
    queue = h.client.task_queue
    assert f"admitted; it runs when a worker polls: no worker is polling task queue {queue}" in (
        prompted.stderr
    )
    assert queue in json.loads(prompted.stdout)["waiting_for_worker"]
    interrupted = await run.run("interrupt", sid)
    assert "queued until a worker is back" in interrupted.stdout, interrupted
    async with h.worker():
        # The interrupt comes first: the prompt woken before it does not run.
        await h.until(lambda: _open_run_closed(h, sid), timeout=30)
        watched = await run.run("watch", sid, "--until-idle")
        assert watched.returncode == 4, watched
        assert "1 prompt is pending that no busy period will run" in watched.stderr
        assert f"sessionflow resume {sid}" in watched.stderr
        assert len(h.requests()) == 0
        resumed = await run.run("resume", sid)
        assert resumed.returncode == 0 and "succeeded" in resumed.stdout, resumed
        assert (await run.run("watch", sid, "--until-idle")).returncode == 0


async def _open_run_closed(h: Harness, sid: str) -> bool:
    status = await h.client.status(sid)
    return status.drain is None and status.pending_inputs == 1


async def test_watch_rides_out_a_store_outage_and_says_so_once(
    temporal_env: WorkflowEnvironment, own_database: str, tmp_path: Path
) -> None:
    """``watch`` gave up about a second into a PostgreSQL restart, and the follower's log
    lines landed in the streamed text. It now waits the outage out, saying so once. The
    worker writes to PostgreSQL directly; ``watch`` reads it through a proxy the test cuts."""
    store = await Target(own_database).open()
    try:
        async with (
            harness(temporal_env.client, store, tmp_path) as h,
            Proxy(5432) as proxy,
        ):
            sid = await h.session(
                [call("g1", "gate", gate=h.gate_file("open"))], [{"text": "after the outage"}]
            )
            await h.client.prompt(sid, "Go")
            await h.until(lambda: h.gate.active == 1, timeout=30)
            proxied = own_database.replace(":5432/", f":{proxy.port}/")
            address = temporal_env.client.service_client.config.target_host
            watch = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sessionflow.cli", "--temporal", address,
                "--database", proxied, "--task-queue", h.client.task_queue,
                "watch", sid, "--until-idle",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert watch.stdout is not None and watch.stderr is not None
            seen = await asyncio.wait_for(watch.stdout.readuntil(b"gate"), 60)  # the call
            await proxy.cut()
            note = await asyncio.wait_for(watch.stderr.readline(), 60)
            assert b"store unavailable, retrying" in note, note
            await proxy.reopen()
            h.open_gate("open")
            await h.client.wait_idle(sid, timeout=60)
            out, err = await asyncio.wait_for(watch.communicate(), 60)
    finally:
        await store.close()
    assert watch.returncode == 0, err
    assert b"after the outage" in seen + out
    assert b"Traceback" not in err and b"Following:" not in err, err
    assert err.count(b"store unavailable") <= 1, err
