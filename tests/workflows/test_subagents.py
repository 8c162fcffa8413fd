"""Subagents: the ``task`` tool, child sessions, containment, cascading interrupts, background
jobs and the bounds of the tree (issue 27). Real Temporal dev server, both databases, the
scripted model (each subagent its own script).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.agents import Agent, Agents
from store import Store
from tests.workflows.harness import Harness, call, harness


def task(call_id: str, agent: str, prompt: str = "Do it", **options: Any) -> dict[str, Any]:
    return call(call_id, "task", description=f"job {call_id}", prompt=prompt,
                subagent_type=agent, **options)


class Tree:
    """A harness whose worker knows subagents, each answering from its own script."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.custom: dict[str, Agent] = {}

    def subagent(self, name: str, *turns: list[dict[str, Any]], mode: str = "subagent") -> None:
        model = self.h.script(*turns, name=f"{name}.json")
        self.custom[name] = Agent(name=name, mode=mode, model=model)  # type: ignore[arg-type]

    def worker(self) -> Any:
        agents = Agents(self.custom)
        self.h.worker_options["agents"] = agents
        self.h.client.agents = agents
        return self.h.worker()


@pytest.fixture
async def tree(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> AsyncIterator[Tree]:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        yield Tree(h)


def results(messages: list[Any]) -> dict[str, tuple[str, str]]:
    """Each settled call of the session: call id -> (status, output or error text)."""
    found: dict[str, tuple[str, str]] = {}
    for message in messages:
        for part in getattr(message, "content", None) or ():
            state = getattr(part, "state", None)
            if getattr(part, "type", "") != "tool" or state is None:
                continue
            if state.status == "completed":
                found[part.call_id] = ("completed", " ".join(c.text for c in state.content))
            elif state.status == "error":
                found[part.call_id] = ("error", state.error.message)
    return found


async def children(h: Harness, sid: str) -> list[Any]:
    return [s for s in await h.store.sessions.list() if s.parent_id == sid]


async def test_three_tasks_at_once_one_succeeds_one_fails_one_times_out(tree: Tree) -> None:
    h = tree.h
    tree.subagent("helper", [{"text": "the helper's answer"}])
    tree.subagent(
        "broken", [{"error": {"kind": "invalid_request", "message": "bad request, sorry"}}]
    )
    tree.subagent("stuck", [{"wait_for_file": h.gate_file("never")}])
    sid = await h.session(
        [task("t1", "helper"), task("t2", "broken"), task("t3", "stuck", timeout_s=1)],
        [{"text": "all done"}],
    )
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")
        await h.client.wait_idle(sid, timeout=60)
        settled = results(await h.messages(sid))
        assert settled["t1"][0] == "completed"
        assert "the helper's answer" in settled["t1"][1]
        assert settled["t2"][0] == "error" and "bad request, sorry" in settled["t2"][1]
        assert settled["t3"][0] == "error"
        assert "did not finish within 1 s and was interrupted" in settled["t3"][1]
        assert (await h.events(sid))[-1].type == "session.execution.succeeded"
        kids = {s.agent: s for s in await children(h, sid)}
        assert sorted(kids) == ["broken", "helper", "stuck"]
        stuck = kids["stuck"].id
        await h.client.wait_idle(stuck, timeout=30)
        terminal = (await h.events(stuck))[-1]
        assert terminal.type == "session.execution.interrupted"
        assert terminal.data["reason"] == "timeout"
        # The parent's second request read all three results, in call order.
        sent = [m["content"][0] for m in h.requests()[1]["messages"][-3:]]
        assert [(c["call_id"], c["is_error"]) for c in sent] == [
            ("t1", False),
            ("t2", True),
            ("t3", True),
        ]
