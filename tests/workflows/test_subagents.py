"""Subagents: the ``task`` tool, child sessions, containment, cascading interrupts, background
jobs and the bounds of the tree (issue 27). Real Temporal dev server, both databases, the
scripted model (each subagent its own script).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.agents import Agent, Agents
from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import running_api
from sessionflow.models.permissions import Rule
from store import Store
from tests.workflows.harness import Harness, call, harness


def task(call_id: str, agent: str, prompt: str = "Do it", **options: Any) -> dict[str, Any]:
    return call(
        call_id, "task", description=f"job {call_id}", prompt=prompt, subagent_type=agent, **options
    )


class Tree:
    """A harness whose worker knows subagents, each answering from its own script."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.custom: dict[str, Agent] = {}

    def subagent(
        self,
        name: str,
        *turns: list[dict[str, Any]],
        mode: str = "subagent",
        price: dict[str, float] | None = None,
    ) -> None:
        model = self.h.script(*turns, name=f"{name}.json", price=price)
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


async def terminal(h: Harness, sid: str) -> Any:
    ended = [e for e in await h.events(sid) if e.type.startswith("session.execution.")]
    return ended[-1]


async def test_interrupting_the_parent_interrupts_every_descendant_first(tree: Tree) -> None:
    h = tree.h
    tree.subagent("leaf", [{"wait_for_file": h.gate_file("leaf")}, {"text": "never"}])
    tree.subagent("mid", [task("m1", "leaf")], [{"text": "never"}])
    tree.subagent("side", [{"wait_for_file": h.gate_file("side")}, {"text": "never"}])
    sid = await h.session([task("t1", "mid"), task("t2", "side")], [{"text": "never"}])
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")

        async def leaf_streaming() -> bool:
            status = await h.client.status(sid)
            return any(grand.busy for child in status.subagents for grand in child.subagents)

        await h.until(leaf_streaming, timeout=30)
        await h.client.interrupt(sid)
        await h.client.wait_idle(sid, timeout=60)
        parent_end = await terminal(h, sid)
        assert parent_end.type == "session.execution.interrupted"
        mid, side = (c.id for c in await children(h, sid))
        (leaf,) = (c.id for c in await children(h, mid))
        for child in (mid, side, leaf):
            ended = await terminal(h, child)
            assert ended.type == "session.execution.interrupted", child
            assert ended.data["reason"].startswith("parent")
            # Settled before the parent settled: nothing of the tree ran on after it.
            assert ended.seq and ended.created <= parent_end.created
            assert not (await h.client.status(child)).busy
        settled = results(await h.messages(sid))
        assert {k: v[0] for k, v in settled.items()} == {"t1": "error", "t2": "error"}


async def test_a_background_task_reports_to_its_idle_parent(tree: Tree) -> None:
    h = tree.h
    tree.subagent("bg", [{"wait_for_file": h.gate_file("bg")}, {"text": "background answer"}])
    sid = await h.session(
        [task("t1", "bg", background=True)],
        [{"text": "started it"}],
        [{"text": "read the result"}],
    )
    async with tree.worker():
        await h.client.prompt(sid, "Start a job")
        await h.until(lambda: len(h.requests()) == 2, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        settled = results(await h.messages(sid))
        assert settled["t1"][0] == "completed" and "Started in the background" in settled["t1"][1]
        (job,) = await h.client.jobs(sid)
        await h.until(lambda: busy(h, job.session.id), timeout=30)
        (job,) = await h.client.jobs(sid)
        assert job.running and job.outcome is None
        async with (
            running_api(h.client, ApiSettings(port=0)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            (listed,) = (await http.get(f"/sessions/{sid}/jobs")).json()
            assert listed["running"] and listed["session"]["id"] == job.session.id
            (child,) = (await http.get(f"/sessions/{sid}/children")).json()
            assert child["parent_id"] == sid and child["settings"]["task"]["background"]
            roots = (await http.get("/sessions", params={"roots": "true"})).json()
            assert [s["id"] for s in roots] == [sid]
        assert [s.id for s in await h.client.list_sessions(roots=True)] == [sid]
        assert len(await h.client.list_sessions()) == 2
        h.open_gate("bg")
        await h.until(lambda: len(h.requests()) == 3, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        third = h.requests()[2]["messages"][-1]
        assert "background answer" in json_text(third)
        (job,) = await h.client.jobs(sid)
        assert not job.running and job.outcome == "succeeded"


def json_text(message: dict[str, Any]) -> str:
    return json.dumps(message)


async def busy(h: Harness, sid: str) -> bool:
    return (await h.client.status(sid)).busy


async def test_interrupting_an_idle_parent_cancels_its_background_task(tree: Tree) -> None:
    h = tree.h
    tree.subagent("bg", [{"wait_for_file": h.gate_file("bg")}, {"text": "never"}])
    sid = await h.session([task("t1", "bg", background=True)], [{"text": "started it"}])
    async with tree.worker():
        await h.client.prompt(sid, "Start a job")
        await h.until(lambda: len(h.requests()) == 2, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        (job,) = await h.client.jobs(sid)
        await h.until(lambda: busy(h, job.session.id), timeout=30)
        await h.client.interrupt(sid)
        await h.client.wait_idle(job.session.id, timeout=30)
        ended = await terminal(h, job.session.id)
        assert ended.type == "session.execution.interrupted"
        assert ended.data["reason"] == "parent user"


async def test_bounds_and_bad_subagents_fail_their_own_calls_clearly(tree: Tree) -> None:
    h = tree.h
    tree.subagent("selfish", [task("s1", "selfish")], [{"text": "gave up"}])
    tree.subagent("deep", [task("d1", "deeper")], [{"text": "deep done"}])
    tree.subagent("deeper", [{"text": "never runs"}])
    sid = await h.session(
        [task("t1", "nope"), task("t2", "build"), task("t3", "selfish"), task("t4", "deep")],
        [{"text": "done"}],
    )
    tree.h.worker_options["max_depth"] = 1
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")
        await h.client.wait_idle(sid, timeout=60)
        settled = results(await h.messages(sid))
        assert settled["t1"][0] == "error"
        assert settled["t1"][1].startswith("Unknown subagent 'nope': the subagents are")
        assert "The build agent is not a subagent (its mode is primary)" in settled["t2"][1]
        kids = {c.agent: c.id for c in await children(h, sid)}
        selfish = results(await h.messages(kids["selfish"]))
        assert "cannot start another selfish subagent (recursion)" in selfish["s1"][1]
        deep = results(await h.messages(kids["deep"]))
        assert "beyond the depth bound (SESSIONFLOW_MAX_DEPTH = 1)" in deep["d1"][1]
        assert settled["t4"][0] == "completed" and "deep done" in settled["t4"][1]


async def test_the_fan_out_bound_refuses_a_task_beyond_it(tree: Tree) -> None:
    h = tree.h
    tree.subagent("slow", [{"wait_for_file": h.gate_file("slow")}, {"text": "slow answer"}])
    sid = await h.session(
        [task("t1", "slow"), task("t2", "slow"), task("t3", "slow")],
        [{"text": "done"}],
        max_active_tools=2,
    )
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")

        async def refused() -> bool:
            return "t3" in results(await h.messages(sid))

        await h.until(refused, timeout=30)
        h.open_gate("slow")
        await h.client.wait_idle(sid, timeout=60)
        settled = results(await h.messages(sid))
        assert [settled[c][0] for c in ("t1", "t2")] == ["completed", "completed"]
        assert settled["t3"][0] == "error"
        assert "the fan-out bound (max_active_tools = 2)" in settled["t3"][1]


async def test_a_child_waiting_for_an_answer_is_seen_and_answered_from_the_parent(
    tree: Tree,
) -> None:
    h = tree.h
    model = h.script([call("e1", "echo", text="hi")], [{"text": "child done"}], name="asker.json")
    tree.custom["asker"] = Agent(
        name="asker",
        mode="subagent",
        model=model,
        permissions=(Rule(tool="echo", action="ask"),),
    )
    sid = await h.session([task("t1", "asker")], [{"text": "parent done"}])
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")

        async def asked() -> list[Any]:
            return (await h.client.status(sid)).asks()

        await h.until(asked, timeout=30)
        ((child, request),) = await asked()
        assert child != sid and request.tool == "echo"
        async with (
            running_api(h.client, ApiSettings(port=0)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            status = (await http.get(f"/sessions/{sid}/status")).json()
            (below,) = status["subagents"]
            assert below["session_id"] == child
            assert below["drain"]["waiting"][0]["request_id"] == request.request_id
        await h.client.respond(child, request.request_id, "once")
        await h.client.wait_idle(sid, timeout=60)
        settled = results(await h.messages(sid))
        assert settled["t1"][0] == "completed" and "child done" in settled["t1"][1]


def spent(text: str, tokens_in: int, tokens_out: int) -> list[dict[str, Any]]:
    usage = {"input": tokens_in, "output": tokens_out, "cache_read": 1}
    return [{"text": text}, {"finish": {"reason": "stop", "usage": usage}}]


async def test_usage_and_cost_roll_up_the_tree(tree: Tree) -> None:
    h = tree.h
    # USD per million tokens; ``mid`` declares no price: its steps' cost is unknown.
    tree.subagent("leaf", spent("leaf answer", 100, 10), price={"input": 10.0, "output": 100.0})
    tree.subagent(
        "mid",
        [task("m1", "leaf"), {"finish": {"reason": "tool-calls", "usage": {"input": 20}}}],
        spent("mid answer", 30, 3),
    )
    sid = await h.session(
        [task("t1", "mid"), {"finish": {"reason": "tool-calls", "usage": {"input": 5}}}],
        spent("done", 7, 1),
        price={"input": 1.0, "output": 2.0, "cache_read": 0.5},
    )
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")
        await h.client.wait_idle(sid, timeout=60)
        usage = await h.client.usage(sid)
        # A step's input counts without its cached tokens (one read each final step).
        own = usage.own
        assert (own.tokens.input, own.tokens.output) == (5 + 6, 1)
        # Root: 5 input, then 6 input + 1 output + 1 cache read.
        assert own.cost == pytest.approx((5 * 1.0 + 6 * 1.0 + 1 * 2.0 + 1 * 0.5) / 1e6)
        (mid,) = usage.children
        assert (mid.agent, mid.own.tokens.input, mid.total.tokens.input) == ("mid", 49, 148)
        assert mid.own.cost is None and mid.own.unpriced_steps == 2
        (leaf,) = mid.children
        assert (leaf.own.tokens.input, leaf.own.tokens.output, leaf.children) == (99, 10, ())
        leaf_usd = (99 * 10.0 + 10 * 100.0) / 1e6  # its cache read has no price: free
        assert leaf.own.cost == pytest.approx(leaf_usd)
        assert mid.total.cost == pytest.approx(leaf_usd)
        total = usage.total
        assert (total.tokens.input, total.tokens.output, total.tokens.cache.read) == (159, 14, 3)
        assert total.cost == pytest.approx(own.usd + leaf_usd)
        assert (total.priced_steps, total.unpriced_steps) == (3, 2)
        # Each step's own cost is in its ``step.ended``: null for the unpriced one.
        assert await step_costs(h, leaf.session_id) == [pytest.approx(leaf_usd)]
        assert await step_costs(h, mid.session_id) == [None, None]
        async with (
            running_api(h.client, ApiSettings(port=0)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as http,
        ):
            served = (await http.get(f"/sessions/{sid}/usage")).json()
            status = (await http.get(f"/sessions/{mid.session_id}/status")).json()
        assert served["total"]["tokens"]["input"] == 159
        assert served["total"]["cost"] == pytest.approx(own.usd + leaf_usd)
        assert served["children"][0]["own"]["cost"] is None
        assert served["children"][0]["children"][0]["own"]["tokens"]["output"] == 10
        assert status["spend"]["cost"] is None and status["spend"]["unpriced_steps"] == 2


async def step_costs(h: Harness, session_id: str) -> list[float | None]:
    events = await h.events(session_id)
    return [e.data["cost"] for e in events if e.type == "session.step.ended"]


def rewrite(h: Harness, *turns: list[dict[str, Any]]) -> None:
    """The parent's script from now on (a scripted model reads its file at each request)."""
    (h.root / "model.json").write_text(json.dumps({"turns": [{"events": e} for e in turns]}))


async def test_interrupting_a_parent_with_a_job_leaves_it_quiet(tree: Tree) -> None:
    """The job the interrupt cancelled does not report back: no turn after the interrupt."""
    h = tree.h
    tree.subagent("bg", [{"wait_for_file": h.gate_file("bg")}, {"text": "never"}])
    sid = await h.session(
        [task("t1", "bg", background=True)],
        [{"text": "started it"}],
        [{"text": "a turn after the user's interrupt"}],
    )
    async with tree.worker():
        await h.client.prompt(sid, "Start a job")
        await h.until(lambda: len(h.requests()) == 2, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        (job,) = await h.client.jobs(sid)
        await h.until(lambda: busy(h, job.session.id), timeout=30)
        await h.client.interrupt(sid)
        await h.client.wait_idle(job.session.id, timeout=30)
        # The job's report ran with its terminal (finish_execution): nothing was admitted.
        assert not await h.store.inputs.pending(sid)
        await h.client.wait_idle(sid, timeout=30)
        assert len(h.requests()) == 2


async def test_follow_ups_in_the_background_deliver_each_answer(tree: Tree) -> None:
    h = tree.h
    tree.subagent(
        "fg",
        [{"text": "first answer"}],
        [{"wait_for_file": h.gate_file("fg")}, {"text": "second answer"}],
    )
    sid = await h.session([task("t1", "fg")], [{"text": "got the first"}])
    async with tree.worker():
        await h.client.prompt(sid, "Start a job")
        await h.client.wait_idle(sid, timeout=30)
        (child,) = await h.client.children(sid)
        rewrite(
            h,
            [task("t1", "fg")],
            [{"text": "got the first"}],
            [task("t2", "fg", prompt="Again", task_id=child.id, background=True)],
            [{"text": "started again"}],
            [{"text": "got the second"}],
        )
        await h.client.prompt(sid, "Continue in the background")
        await h.until(lambda: len(h.requests()) == 4, timeout=30)
        h.open_gate("fg")
        await h.until(lambda: len(h.requests()) == 5, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        assert "second answer" in json_text(h.requests()[4]["messages"][-1])
        assert len(await h.client.children(sid)) == 1  # the same child, continued


async def test_an_interrupt_while_the_child_starts_stops_the_child(
    tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    import activities.children as children_module

    original, started = children_module.start_drain, asyncio.Event()

    async def slow(*args: Any) -> None:  # the interrupt lands while the start is answered
        await original(*args)
        started.set()
        await asyncio.sleep(3)

    monkeypatch.setattr(children_module, "start_drain", slow)
    h = tree.h
    tree.subagent("kid", [{"wait_for_file": h.gate_file("kid")}, {"text": "kid answer"}])
    sid = await h.session([task("t1", "kid")], [{"text": "never"}])
    async with tree.worker():
        await h.client.prompt(sid, "Delegate")
        await h.until(started.is_set, timeout=30)
        (kid,) = await h.client.children(sid)
        await h.client.interrupt(sid)
        await h.client.wait_idle(sid, timeout=60)
        await h.client.wait_idle(kid.id, timeout=30)
        ended = await terminal(h, kid.id)
        assert ended.type == "session.execution.interrupted"
        assert ended.data["reason"] == "parent interrupted"


async def test_a_follow_up_its_child_never_took_fails_when_the_child_is_interrupted(
    tree: Tree,
) -> None:
    h = tree.h
    tree.subagent(
        "bg", [{"wait_for_file": h.gate_file("bg")}, {"text": "never"}], [{"text": "second"}]
    )
    sid = await h.session([task("t1", "bg", background=True)], [{"text": "started it"}])
    async with tree.worker():
        await h.client.prompt(sid, "Start a job")
        await h.until(lambda: len(h.requests()) == 2, timeout=30)
        await h.client.wait_idle(sid, timeout=30)
        (job,) = await h.client.jobs(sid)
        cid = job.session.id
        await h.until(lambda: busy(h, cid), timeout=30)
        rewrite(
            h,
            [task("t1", "bg", background=True)],
            [{"text": "started it"}],
            [task("t2", "bg", prompt="Again", task_id=cid)],
            [{"text": "parent done"}],
        )
        await h.client.prompt(sid, "Ask it more")

        async def waiting() -> bool:
            drain = (await h.client.status(sid)).drain
            return drain is not None and bool(drain.children)

        await h.until(waiting, timeout=30)
        await h.client.interrupt(cid)
        await h.client.wait_idle(sid, timeout=30)
        settled = results(await h.messages(sid))
        assert settled["t2"][0] == "error"
        assert "was interrupted: user (before it took this task)" in settled["t2"][1]
