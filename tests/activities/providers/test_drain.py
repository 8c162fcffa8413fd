"""A full drain per adapter: Temporal, the store, a tool, and the adapter against the local server.

The second request is built from what the first stream stored, so these tests close the loop of
reference §7.2 cases 35 and 36: reasoning state and hosted results survive the store and replay
exactly.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from activities.history import DEFAULT_SYSTEM
from activities.providers.base import Provider
from activities.providers.prices import step_cost
from activities.providers.registry import make_provider
from activities.tools.base import ToolRegistry
from activities.tools.testing import Echo
from sessionflow.client import SessionClient
from sessionflow.models.common import ModelRef
from sessionflow.models.messages import AssistantMessage, ToolCompleted
from store import Store
from tests.activities.providers import support
from tests.activities.providers.server import ReplayServer, Reply
from worker import build_worker

EPHEMERAL = {"type": "ephemeral"}


@dataclass
class Drain:
    client: SessionClient
    server: ReplayServer
    workspace: Path

    async def run(self, model: str, *prompts: str) -> str:
        session = await self.client.create_session(workspace=str(self.workspace), model=model)
        for prompt in prompts:
            await self.client.prompt(session, prompt)
            await self.client.wait_idle(session, timeout=30)
        return session

    def sent(self, index: int) -> dict[str, Any]:
        body: dict[str, Any] = self.server.requests[index].json()
        return body


@pytest.fixture
async def drain(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path, replay_server: ReplayServer
) -> AsyncIterator[Drain]:
    replay_server.reset()
    provider_settings = support.settings(replay_server, web_search=True)

    def providers(model: ModelRef) -> Provider:
        provider = make_provider(model, provider_settings)
        assert provider is not None
        return provider

    task_queue = f"tq-{uuid.uuid4()}"
    worker = build_worker(
        temporal_env.client,
        store,
        task_queue=task_queue,
        tools=ToolRegistry([Echo()]),
        providers=providers,
        sandboxed=True,
    )
    client = SessionClient(temporal_env.client, store, task_queue=task_queue)
    async with worker:
        yield Drain(client, replay_server, tmp_path)


def queue(drain: Drain, *names: str) -> None:
    drain.server.queue(*(Reply.events(*support.recording(name)) for name in names))


async def assistants(drain: Drain, session: str) -> list[AssistantMessage]:
    messages = await drain.client.messages(session)
    return [message for message in messages if isinstance(message, AssistantMessage)]


async def echoed(drain: Drain, session: str) -> list[str]:
    first = (await assistants(drain, session))[0]
    return [
        part.state.structured["text"]
        for part in first.content
        if part.type == "tool" and isinstance(part.state, ToolCompleted)
    ]


async def test_chat_completions_drain_runs_tools_and_replays_them(drain: Drain) -> None:
    queue(drain, "chat_parallel_tools.sse", "chat_text.sse")
    session = await drain.run("openai-chat/gpt-4o-mini", "Echo twice.")
    assert len(drain.server.requests) == 2
    assert await echoed(drain, session) == ["one", "two"]
    calls = drain.sent(1)["messages"][2]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
        ("call_abc", '{"text": "one"}'),
        ("call_def", '{"text": "two"}'),
    ]
    assert drain.sent(1)["messages"][3:] == [
        {"role": "tool", "tool_call_id": "call_abc", "content": "one"},
        {"role": "tool", "tool_call_id": "call_def", "content": "two"},
    ]
    last = (await assistants(drain, session))[-1]
    assert last.finish == "stop" and last.tokens is not None
    assert (last.tokens.input, last.tokens.cache.read) == (9, 16)
    # The step's cost comes from genai-prices and reaches the session's totals. gpt-4o-mini:
    # 0.15 input, 0.075 cached input, 0.6 output per million (2 output tokens here).
    model = ModelRef.parse("openai-chat/gpt-4o-mini")
    assert last.cost == pytest.approx(step_cost(model, last.tokens))
    assert last.cost == pytest.approx((9 * 0.15 + 16 * 0.075 + last.tokens.output * 0.6) / 1e6)
    info = await drain.client.session(session)
    costs = [a.cost for a in await assistants(drain, session)]
    assert None not in costs
    assert info.spend.cost == pytest.approx(sum(c for c in costs if c is not None))
    assert info.spend.priced_steps == 2 and info.spend.unpriced_steps == 0


async def test_responses_drain_replays_encrypted_reasoning_and_hosted_search(drain: Drain) -> None:
    queue(drain, "responses_reasoning_tools.sse", "responses_web_search.sse")
    queue(drain, "responses_web_search.sse")
    session = await drain.run("openai/gpt-5", "Echo twice.", "Search now.")
    assert len(drain.server.requests) == 3
    assert await echoed(drain, session) == ["one", "two"]
    second = drain.sent(1)
    assert second["prompt_cache_key"] == drain.sent(0)["prompt_cache_key"]
    assert second["input"][1:] == [
        {
            "type": "reasoning",
            "id": "rs_68a1",
            "summary": [
                {
                    "type": "summary_text",
                    "text": "**Planning**\n\nEcho both words.\n\nCall the tool twice.",
                }
            ],
            "encrypted_content": "gAAAAABoq-encrypted-reasoning-1==",
        },
        {
            "type": "function_call",
            "call_id": "call_one",
            "name": "echo",
            "arguments": '{"text": "one"}',
        },
        {
            "type": "function_call",
            "call_id": "call_two",
            "name": "echo",
            "arguments": '{"text": "two"}',
        },
        {"type": "function_call_output", "call_id": "call_one", "output": "one"},
        {"type": "function_call_output", "call_id": "call_two", "output": "two"},
    ]
    hosted = drain.sent(2)["input"][-3]  # the second turn's search, replayed inline
    assert hosted == {
        "type": "web_search_call",
        "id": "ws_68b1",
        "status": "completed",
        "action": {
            "type": "search",
            "query": "temporal durable execution",
            "sources": [{"type": "url", "url": "https://docs.temporal.io/"}],
        },
    }
    assert drain.sent(2)["input"][-2:] == [
        {"role": "assistant", "content": "Temporal runs durable workflows."},
        {"role": "user", "content": [{"type": "input_text", "text": "Search now."}]},
    ]


async def test_anthropic_drain_replays_signed_thinking_and_hosted_search(drain: Drain) -> None:
    queue(drain, "anthropic_thinking_tools.sse", "anthropic_web_search.sse")
    session = await drain.run("anthropic/claude-haiku-4-5", "Echo twice.")
    assert len(drain.server.requests) == 2
    assert await echoed(drain, session) == ["one", "two"]
    second = drain.sent(1)
    assert second["system"] == [
        {"type": "text", "text": DEFAULT_SYSTEM, "cache_control": EPHEMERAL}
    ]
    assert second["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "thinking",
                    "thinking": "I should echo both words.",
                    "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds",
                },
                {
                    "type": "redacted_thinking",
                    "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP",
                },
                {"type": "text", "text": "Echoing both."},
                {"type": "tool_use", "id": "toolu_01A", "name": "echo", "input": {"text": "one"}},
                {"type": "tool_use", "id": "toolu_01B", "name": "echo", "input": {"text": "two"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "one"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01B",
                    "content": "two",
                    "cache_control": EPHEMERAL,
                },
            ],
        },
    ]
    queue(drain, "anthropic_web_search.sse")
    await drain.client.prompt(session, "Again.")
    await drain.client.wait_idle(session, timeout=30)
    hosted = drain.sent(2)["messages"][3]["content"]
    assert [block["type"] for block in hosted] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "text",
    ]
    assert hosted[1]["input"] == {"query": "temporal durable execution"}
    assert hosted[2]["content"][0]["encrypted_content"] == "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5"


async def test_a_models_lone_surrogate_is_sent_back_as_a_replacement_character(
    drain: Drain,
) -> None:
    # The model's reply ends in half an emoji (a JSON escape the SDK decodes to a lone
    # surrogate); the store keeps it exactly, and the next request must still be sendable.
    text = [
        chunk.replace(b"Hello", b"Half \\ud83d") for chunk in support.recording("chat_text.sse")
    ]
    drain.server.queue(Reply.events(*text), Reply.events(*support.recording("chat_text.sse")))
    session = await drain.run("openai-chat/gpt-4o-mini", "Say hello.", "Again.")
    assert len(drain.server.requests) == 2
    first = (await assistants(drain, session))[0]
    assert first.content[0].text == "Half \ud83d, world."  # type: ignore[union-attr]
    assert drain.sent(1)["messages"][2] == {"role": "assistant", "content": "Half \ufffd, world."}
    assert "session.execution.failed" not in [e.type async for e in drain.client.events(session)]
