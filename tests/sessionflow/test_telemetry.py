"""OpenTelemetry: one trace from a prompt to the end of its drain, with our own spans inside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from sessionflow import telemetry
from store import Store
from tests.workflows.harness import harness


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter


async def test_a_prompt_and_its_drain_form_one_trace(
    spans: InMemorySpanExporter, temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    config = temporal_env.client.config()
    client = Client(**{**config, "interceptors": telemetry.interceptors()})
    spans.clear()
    async with harness(client, store, tmp_path) as h:
        tool = {"tool_call": {"id": "call_1", "name": "echo", "input": {"text": "hi"}}}
        usage = {"input": 120, "output": 30, "reasoning": 10, "cache_read": 100}
        finish = {"finish": {"reason": "stop", "usage": usage}}
        sid = await h.session([tool], [{"text": "done"}, finish], price={"input": 2, "output": 8})
        with telemetry.tracer().start_as_current_span("user.prompt"):
            await h.client.prompt(sid, "Go")
        await h.client.wait_idle(sid)
    finished = spans.get_finished_spans()
    by_name = {span.name: span for span in finished}
    root = by_name["user.prompt"]
    turns = [s for s in finished if s.name == "provider.turn"]
    tools = [s for s in finished if s.name == "tool.run"]
    appends = [s for s in finished if s.name == "store.append"]
    assert len(turns) == 2 and len(tools) == 1 and appends
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in [*turns, *tools, *appends]} == {trace_id}
    assert any(s.name.startswith("SignalWithStartWorkflow") for s in finished)
    assert any(s.name == "RunActivity:stream_turn" for s in finished)
    assert tools[0].attributes["tool"] == "echo" and tools[0].attributes["outcome"] == "completed"
    assert turns[0].attributes["tool_calls"] == 1 and turns[1].attributes["finish"] == "stop"
    # The GenAI semantic conventions: input counts its cache reads, output its reasoning.
    last = turns[1].attributes
    assert last["gen_ai.conversation.id"] == sid and last["gen_ai.operation.name"] == "chat"
    assert last["gen_ai.provider.name"] == "scripted"
    assert (last["gen_ai.usage.input_tokens"], last["gen_ai.usage.output_tokens"]) == (120, 30)
    assert last["gen_ai.usage.cache_read.input_tokens"] == 100
    assert last["gen_ai.usage.reasoning.output_tokens"] == 10
    assert last["gen_ai.response.finish_reasons"] == ("stop",)
    assert last["cost"] == pytest.approx((20 * 2 + 30 * 8) / 1e6)  # cache reads unpriced
