"""Drain test fixtures: ``h``, a harness on a real Temporal dev server, on both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from store import Store
from tests.conftest import allowed_breaks
from tests.workflows.harness import Harness, harness
from tests.workflows.workers import WorkerProcess


@pytest.fixture
async def h(
    request: pytest.FixtureRequest, temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> AsyncIterator[Harness]:
    breaks = allowed_breaks(request.node)
    async with harness(temporal_env.client, store, tmp_path, breaks=breaks) as running:
        yield running


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    """Worker processes a test starts; any still running are killed afterwards."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop()
