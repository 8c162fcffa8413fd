"""The whole subagent tree survives the death of every worker (issue 27).

A parent waits on three children: two stream a turn, one runs a tool. The only worker is killed
(SIGKILL) with all three in flight; another starts. Each child carries on from where it was
(the lost turn is closed and continued, the retry-safe tool runs again), no child is created or
started twice, the parent receives each result exactly once, and every session of the tree
keeps the log's invariants.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.restart import RESTART_TEXT
from store import Store
from tests.conftest import StoreFactory, Target
from tests.invariants import assert_clean, check_store, final_log
from tests.store.helpers import expire_claim
from tests.workflows.harness import Harness, call, harness
from tests.workflows.test_recovery import sweep
from tests.workflows.test_subagents import Tree, busy, results, task
from tests.workflows.workers import WorkerProcess

pytestmark = pytest.mark.fault  # worker processes killed and started: the slow fault tests

STREAMED = 10


def streaming(h: Harness, name: str) -> list[dict[str, Any]]:
    """Some text, then a wait nobody ends: the kill lands mid-stream."""
    return [
        {"text": "".join(f"{name}{i}," for i in range(STREAMED)), "chunks": STREAMED},
        {"wait_for_file": h.gate_file("never")},
    ]


def write_agents(h: Harness) -> Path:
    """Three subagents, each answering from its own script, as a worker process loads them."""
    specs = {
        "alpha": h.script(streaming(h, "a"), [{"text": "alpha answer"}], name="alpha.json"),
        "beta": h.script(streaming(h, "b"), [{"text": "beta answer"}], name="beta.json"),
        "gamma": h.script(
            [call("g1", "gate", text="gated", gate=h.gate_file("tool"))],
            [{"text": "gamma answer"}],
            name="gamma.json",
        ),
    }
    path = h.root / "agents.json"
    agents = {name: {"mode": "subagent", "model": model} for name, model in specs.items()}
    path.write_text(json.dumps({"agents": agents}))
    return path


async def count(h: Harness, sid: str, kind: str) -> int:
    return (await h.types(sid, deltas=True)).count(kind)


async def test_killing_every_worker_with_children_in_flight_recovers_the_tree(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        agents = str(write_agents(h))
        sid = await h.session(
            [task("t1", "alpha"), task("t2", "beta"), task("t3", "gamma")],
            [{"text": "all three answered"}],
        )
        first = WorkerProcess(temporal_env, target, h.client.task_queue, SESSIONFLOW_AGENTS=agents)
        workers.append(first)
        await first.ready()
        await h.client.prompt(sid, "Delegate")

        async def in_flight() -> bool:
            kids = {c.agent: c.id for c in await store.sessions.list(parent_id=sid)}
            if sorted(kids) != ["alpha", "beta", "gamma"]:
                return False
            return (
                await count(h, kids["alpha"], "session.text.delta") >= 3
                and await count(h, kids["beta"], "session.text.delta") >= 3
                and await count(h, kids["gamma"], "session.tool.called") == 1
            )

        await h.until(in_flight, timeout=60)
        first.signal(signal.SIGKILL)
        assert await first.exited() == -signal.SIGKILL
        second = WorkerProcess(temporal_env, target, h.client.task_queue, SESSIONFLOW_AGENTS=agents)
        workers.append(second)
        await second.ready()
        h.open_gate("tool")
        await h.client.wait_idle(sid, timeout=120)

        kids = {c.agent: c.id for c in await store.sessions.list(parent_id=sid)}
        assert sorted(kids) == ["alpha", "beta", "gamma"]  # none created twice
        for name, cid in kids.items():
            log = await final_log(store, cid)
            assert_clean(log)
            types = [e.data.type for e in log]
            assert types.count("session.execution.started") == 1, name  # started once
            assert types[-1] == "session.execution.succeeded", name
        for name in ("alpha", "beta"):
            # Continued from the partial turn, never asked again from the start.
            messages = await store.sessions.messages(kids[name])
            assert [m.text for m in messages if m.type == "synthetic"] == [RESTART_TEXT]
            lost = next(m for m in messages if m.type == "assistant")
            assert lost.finish == "error" and lost.content[0].text.startswith(f"{name[0]}0,")
            requests = h.requests(f"{name}.json")
            assert len(requests) == 2
            assert requests[1]["messages"][1]["role"] == "assistant"
        gamma = results(await store.sessions.messages(kids["gamma"]))
        assert gamma == {"g1": ("completed", "gated")}  # the retry-safe tool ran again
        assert len(h.requests("gamma.json")) == 2

        parent = await final_log(store, sid)
        assert_clean(parent)
        settled = results(await store.sessions.messages(sid))
        assert {k: v[0] for k, v in settled.items()} == dict.fromkeys(
            ("t1", "t2", "t3"), "completed"
        )
        for call_id, answer in (("t1", "alpha"), ("t2", "beta"), ("t3", "gamma")):
            assert f"{answer} answer" in settled[call_id][1]
        successes = [e.data.call_id for e in parent if e.data.type == "session.tool.success"]
        assert sorted(successes) == ["t1", "t2", "t3"]  # each result delivered once
        assert len(h.requests()) == 2
        sent = [m["content"][0]["call_id"] for m in h.requests()[1]["messages"][-3:]]
        assert sent == ["t1", "t2", "t3"]


async def test_the_sweep_recovers_a_terminated_parent_and_keeps_every_result(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> None:
    """Reference §7.4 #3, in a tree: the parent's drain is terminated while it waits on two
    children. One child answers before the sweep recovers the parent: the recovery settles
    its call with the answer. The other still runs then: its call closes saying so, and its
    answer arrives later as a message. Nothing runs twice."""
    store = await open_test_store()
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        tree = Tree(h)
        tree.subagent("one", [{"wait_for_file": h.gate_file("one")}, {"text": "one answer"}])
        tree.subagent("two", [{"wait_for_file": h.gate_file("two")}, {"text": "two answer"}])
        # A timeout bounds how long the parent's claim is held while it waits (its hold).
        sid = await h.session(
            [task("t1", "one", timeout_s=3), task("t2", "two", timeout_s=3)],
            [{"text": "continued"}],
            [{"text": "read the late answer"}],
        )
        async with tree.worker():
            await h.client.prompt(sid, "Delegate")

            async def both_streaming() -> bool:
                kids = await store.sessions.list(parent_id=sid)
                return len(kids) == 2 and all([await busy(h, k.id) for k in kids])

            await h.until(both_streaming, timeout=30)
            kids = {c.agent: c.id for c in await store.sessions.list(parent_id=sid)}
            await h.client._handle(sid).terminate("simulated loss of the parent's drain")
            h.open_gate("one")
            await h.until(lambda: idle_with(h, kids["one"], "succeeded"), timeout=30)
            await expire_claim(store, sid)  # as waiting out its lease would
            assert await _expired(store, sid)
            assert sid in (await sweep(h, temporal_env)).woken
            await h.until(lambda: len(h.requests()) == 2, timeout=30)
            await h.client.wait_idle(sid, timeout=30)
            settled = results(await store.sessions.messages(sid))
            assert settled["t1"] == ("completed", settled["t1"][1])
            assert "one answer" in settled["t1"][1]
            assert settled["t2"][0] == "error"
            assert f"subagent (task_id {kids['two']}) runs on" in settled["t2"][1]
            h.open_gate("two")
            await h.until(lambda: len(h.requests()) == 3, timeout=30)
            await h.client.wait_idle(sid, timeout=30)
            assert "two answer" in json.dumps(h.requests()[2]["messages"][-1])
        assert sorted(c.id for c in await store.sessions.list(parent_id=sid)) == sorted(
            kids.values()
        )
        for cid in kids.values():
            types = await h.types(cid)
            assert types.count("session.execution.started") == 1
            assert len(h.requests(f"{'one' if cid == kids['one'] else 'two'}.json")) == 1
        await check_store(store)


async def idle_with(h: Harness, sid: str, outcome: str) -> bool:
    ended = [t for t in await h.types(sid) if t.startswith("session.execution.")]
    return bool(ended) and ended[-1] == f"session.execution.{outcome}"


async def _expired(store: Store, sid: str) -> bool:
    return sid in await store.claims.expired(phases=("unknown", "continue"))


async def test_a_child_recovered_by_the_sweep_answers_its_call(
    temporal_env: WorkflowEnvironment, open_test_store: StoreFactory, tmp_path: Path
) -> None:
    """The dead run's end ("superseded") is not the child's answer: the run that took over
    goes on with the same prompt, and its answer settles the parent's call."""
    store = await open_test_store()
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        tree = Tree(h)
        tree.subagent(
            "one",
            [{"text": "partial"}, {"wait_for_file": h.gate_file("never")}],
            [{"text": "answer after the restart"}],
        )
        sid = await h.session([task("t1", "one")], [{"text": "parent done"}])
        async with tree.worker():
            await h.client.prompt(sid, "Delegate")

            async def streaming() -> bool:
                kids = await store.sessions.list(parent_id=sid)
                return len(kids) == 1 and bool(h.requests("one.json"))

            await h.until(streaming, timeout=30)
            (kid,) = await store.sessions.list(parent_id=sid)
            await h.client._handle(kid.id).terminate("simulated loss of the child's drain")
            await expire_claim(store, kid.id)
            assert await _expired(store, kid.id)
            assert kid.id in (await sweep(h, temporal_env)).woken
            await h.client.wait_idle(sid, timeout=60)
            settled = results(await store.sessions.messages(sid))
            assert settled["t1"][0] == "completed"
            assert "answer after the restart" in settled["t1"][1]
        await check_store(store)
