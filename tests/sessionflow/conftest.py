"""Fixtures of the public face's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from tests.sessionflow.test_cli import Cli, cli_on
from tests.workflows.harness import Harness


@pytest.fixture
async def on_b(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> AsyncIterator[tuple[Cli, Harness]]:
    """The CLI on a store whose only worker serves host ``b`` (its tools' queue included)."""
    async with cli_on(temporal_env, tmp_path, start_worker=False) as (cli, h):
        h.worker_options = {"host": "b"}
        async with h.worker():
            yield cli, h
