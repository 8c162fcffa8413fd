"""The session drain on a real Temporal dev server, on both databases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from store import Store
from tests.workflows.harness import Harness, harness


@pytest.fixture
async def h(temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path) -> AsyncIterator[Harness]:
    async with harness(temporal_env.client, store, tmp_path) as running:
        yield running


async def test_a_prompt_runs_one_plain_text_turn(h: Harness) -> None:
    sid = await h.session([{"text": "Hello there", "chunks": 3}])
    await h.client.prompt(sid, "Hi")
    await h.client.wait_idle(sid, timeout=30)
    assert await h.types(sid) == [
        "session.created",
        "session.prompt.admitted",
        "session.execution.started",
        "session.prompt.promoted",
        "session.step.started",
        "session.text.started",
        "session.text.ended",
        "session.step.ended",
        "session.execution.succeeded",
    ]
    assert len(h.requests()) == 1
