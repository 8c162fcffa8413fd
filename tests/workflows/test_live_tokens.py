"""Tokens are live the moment they exist: a follower in another process sees what the model
said before a pause while the pause still lasts (the scripted provider waits on a file that
only the test creates, after the follower saw the tokens)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, harness

ROOT = Path(__file__).parents[2]


class Follower:
    def __init__(self, target: Target, session_id: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.workflows.follower",
                target.url,
                target.schema or "-",
                session_id,
            ],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )

    async def until(self, predicate: Any) -> dict[str, Any]:
        """The first event the follower printed that satisfies ``predicate``."""
        assert self.process.stdout is not None
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(self.process.stdout.readline), 30)
            assert line, "the follower ended"
            event = json.loads(line)
            if predicate(event):
                return event

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


def _delta(kind: str, text: str) -> Any:
    return lambda e: e["type"] == kind and e["data"]["delta"] == text


CASES = {
    "text": ([{"text": "first words"}], "session.text.delta", "first words"),
    "reasoning": ([{"reasoning": "a thought"}], "session.reasoning.delta", "a thought"),
    "tool input": (
        [
            {"event": {"kind": "tool-input-start", "id": "c1", "name": "echo"}},
            {"event": {"kind": "tool-input-delta", "id": "c1", "delta": '{"text": '}},
        ],
        "session.tool.input.delta",
        '{"text": ',
    ),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_follower_sees_what_came_before_a_pause_during_the_pause(
    h: Harness, target: Target, case: str
) -> None:
    before, kind, text = CASES[case]
    sid = await h.session(
        [*before, {"wait_for_file": h.gate_file("pause")}, {"text": "after"}], [{"text": "x"}]
    )
    follower = Follower(target, sid)
    try:
        await follower.until(lambda e: e["type"] == "ready")
        await h.client.prompt(sid, "Go")
        await follower.until(_delta(kind, text))  # the provider is still paused
        assert not Path(h.gate_file("pause")).exists()
    finally:
        h.open_gate("pause")
        follower.stop()
    if case == "tool input":
        await h.client.interrupt(sid)  # the call never completes; end the turn
    await h.client.wait_idle(sid, timeout=30)


async def test_the_last_text_before_a_long_wait_is_live(h: Harness, target: Target) -> None:
    sid = await h.session([{"text": "last words"}, {"wait_ms": 600_000}])
    follower = Follower(target, sid)
    try:
        await follower.until(lambda e: e["type"] == "ready")
        await h.client.prompt(sid, "Go")
        await follower.until(_delta("session.text.delta", "last words"))
    finally:
        follower.stop()
    assert (await h.client.interrupt(sid)).status == "stopped"  # ends the ten-minute wait
    await h.client.wait_idle(sid, timeout=30)


async def test_a_turns_first_tokens_do_not_wait_for_the_batch_interval(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, target: Target
) -> None:
    """With a batch interval of a minute, the first text of a turn still reaches a follower
    in another process while the provider waits: the interval paces the flushes after the
    first, it never holds the first back (the follower would wait a minute, past its bound)."""
    async with harness(temporal_env.client, store, tmp_path, batch_ms=60_000) as h:
        sid = await h.session([{"text": "at once"}, {"wait_for_file": h.gate_file("pause")}])
        follower = Follower(target, sid)
        try:
            await follower.until(lambda e: e["type"] == "ready")
            await h.client.prompt(sid, "Go")
            await follower.until(_delta("session.text.delta", "at once"))
            assert not Path(h.gate_file("pause")).exists()
        finally:
            h.open_gate("pause")
            follower.stop()
        await h.client.wait_idle(sid, timeout=90)
