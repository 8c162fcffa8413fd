"""Questions (reference #65) and agents (reference §7.2 #9-14, the built-in build and plan).

Real Temporal dev server, both databases, the scripted model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.history import DEFAULT_SYSTEM
from sessionflow.agents import Agent, Agents, UnknownAgentError
from sessionflow.models.messages import AssistantMessage
from sessionflow.models.permissions import Rule
from store import Store
from tests.workflows.harness import Harness, call, harness
from tests.workflows.test_permissions import asked, tool_errors


async def test_a_question_is_answered_and_the_answer_is_its_result(h: Harness) -> None:
    sid = await h.session(
        [call("q1", "question", question="Which branch?", options=["main", "dev"])],
        [{"text": "ok"}],
    )
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    assert (request.kind, request.question, request.options) == (
        "question",
        "Which branch?",
        ("main", "dev"),
    )
    await h.client.answer(sid, request.request_id, "dev")
    await h.client.wait_idle(sid, timeout=30)
    sent = h.requests()[1]["messages"][-1]["content"][0]["output"]
    assert sent == "dev"
    (replied,) = [e for e in await h.events(sid) if e.type == "session.permission.replied"]
    assert replied.data["answer"] == "dev"


async def test_a_cancelled_question_interrupts_the_turn(h: Harness) -> None:
    # Reference #65.
    sid = await h.session([call("q1", "question", question="Go on?")], [{"text": "never"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    await h.client.respond(sid, request.request_id, "reject")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 1
    assert tool_errors(await h.messages(sid)) == ["Tool execution interrupted"]
    assert (await h.events(sid))[-1].type == "session.execution.interrupted"


async def test_the_plan_agent_cannot_write(h: Harness) -> None:
    sid = await h.session(
        [call("w1", "write", path="a.txt", content="x")], [{"text": "ok"}], agent="plan"
    )
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    tools = [tool["name"] for tool in h.requests()[0]["tools"]]
    assert "write" not in tools and "edit" not in tools and "read" in tools
    assert tool_errors(await h.messages(sid)) == ["Tool is not available for this request: write"]
    assert not (h.workspace / "a.txt").exists()
    started = next(e for e in await h.events(sid) if e.type == "session.step.started")
    assert started.data["agent"] == "plan"


REVIEWER = Agent(
    name="reviewer",
    system="You review code.",
    max_steps=2,
    permissions=(Rule(tool="bash", pattern="touch *", action="allow"),),
)
BLANK = Agent(name="blank", mode="primary", system="")


@pytest.fixture
async def hr(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> AsyncIterator[Harness]:
    """A harness whose worker and client know the reviewer, the configured default agent."""
    known = Agents({"reviewer": REVIEWER, "blank": BLANK}, default="reviewer")
    async with harness(temporal_env.client, store, tmp_path, agents=known) as running:
        running.client.agents = known
        yield running


async def test_agent_system_prompts_and_the_configured_default(hr: Harness) -> None:
    # Reference #9-14: no agent named -> the configured default (its system prompt); a
    # selected agent without one -> the default prompt. The selection applies between turns.
    h = hr
    sid = await h.session([{"text": "one"}], [{"text": "two"}])
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.set_agent(sid, "build")
    await h.client.prompt(sid, "Again")
    await h.client.wait_idle(sid, timeout=30)
    first, second = h.requests()
    assert first["system"] == ["You review code."]
    assert second["system"][0].startswith("You are a coding agent")
    starts = [e.data["agent"] for e in await h.events(sid) if e.type == "session.step.started"]
    assert starts == ["reviewer", "build"]
    # Reference §7.2 #12: the assistant message of the omitted agent is the default agent's.
    assert await _agents(h, sid) == ["reviewer", "build"]


async def _agents(h: Harness, sid: str) -> list[str]:
    return [m.agent for m in await h.messages(sid) if isinstance(m, AssistantMessage)]


async def test_10_an_agent_with_an_empty_system_prompt_gets_the_default_prompt(
    hr: Harness,
) -> None:
    # Reference §7.2 #10 (its model-family prompt is this product's one default prompt).
    h = hr
    sid = await h.session([{"text": "one"}], agent="blank")
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    (request,) = h.requests()
    assert request["system"] == [DEFAULT_SYSTEM]
    assert await _agents(h, sid) == ["blank"]


async def test_16_an_agent_selected_while_the_attempt_runs_applies_only_from_the_next(
    hr: Harness,
) -> None:
    # Reference §7.2 #16. The attempt samples its agent when it opens; the selection here
    # lands once its request is out and before any of its step is published.
    h = hr
    sid = await h.session(
        [{"wait_for_file": h.gate_file("provider")}, {"text": "one"}], [{"text": "two"}]
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.set_agent(sid, "build")
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    (request,) = h.requests()
    assert request["system"] == ["You review code."]
    assert await _agents(h, sid) == ["reviewer"]
    await h.client.prompt(sid, "Again")
    await h.client.wait_idle(sid, timeout=30)
    assert h.requests()[1]["system"] == [DEFAULT_SYSTEM]
    starts = [e.data["agent"] for e in await h.events(sid) if e.type == "session.step.started"]
    assert starts == ["reviewer", "build"]
    assert await _agents(h, sid) == ["reviewer", "build"]


async def test_an_agents_rules_and_step_limit_apply(hr: Harness) -> None:
    h = hr
    sid = await h.session([call("b1", "bash", command="touch r.txt")], [{"text": "x"}])
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "r.txt").exists()  # build would have asked
    assert "session.permission.asked" not in await h.types(sid)
    # max_steps = 2: the second request is the last step's, without tools.
    assert h.requests()[1]["tools"] == []


async def test_an_unknown_agent_is_an_error_at_the_edge(h: Harness) -> None:
    with pytest.raises(UnknownAgentError, match="build, explore, general, plan"):
        await h.session([{"text": "x"}], agent="nobody")
    sid = await h.session([{"text": "x"}])
    with pytest.raises(UnknownAgentError):
        await h.client.set_agent(sid, "nobody")
    assert "session.agent.selected" not in await h.types(sid)
