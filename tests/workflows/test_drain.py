"""The session drain on a real Temporal dev server, on both databases."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from store import Store
from tests.workflows.harness import Harness, call, harness
from tests.workflows.tools import registry
from worker import build_worker


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


ALLOW_BASH = [{"tool": "bash", "action": "allow"}]


def assistant_events(events: list, assistant_id: str) -> list[str]:
    return [
        e.type
        for e in events
        if e.data.get("assistant_message_id") == assistant_id
        and not e.type.endswith(".delta")
        and not e.type.startswith("session.text")
        and not e.type.startswith("session.tool.input")
    ]


# A provider-executed call whose result never comes.
UNANSWERED_SEARCH = {
    "event": {
        "kind": "tool-call",
        "call_id": "ws_1",
        "name": "web_search",
        "input": {"query": "x"},
        "provider_executed": True,
    }
}


async def run(h: Harness, sid: str, text: str = "Go") -> None:
    await h.client.prompt(sid, text)
    await h.client.wait_idle(sid, timeout=30)


async def test_continues_after_durably_settling_one_local_tool(h: Harness) -> None:
    sid = await h.session([call("call_1", text="hi")], [{"text": "Done"}])
    await run(h, sid)
    requests = h.requests()
    assert len(requests) == 2
    assert h.roles(requests[1]) == ["user", "assistant", "tool"]
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.success",
        "session.step.ended",
    ]
    assert assistant.finish == "tool-calls"
    tool = assistant.content[-1]
    assert tool.state.status == "completed" and tool.state.structured == {"text": "hi"}


@pytest.mark.parametrize("cap", [8, 2])
async def test_tools_start_eagerly_while_the_model_streams_up_to_the_cap(
    h: Harness, cap: int
) -> None:
    """Catalogue S10: the parallel tool cap."""
    tools, provider = h.gate_file("tools"), h.gate_file("provider")
    sid = await h.session(
        [
            *[call(f"call_{i}", "gate", text=str(i), gate=tools) for i in range(5)],
            {"wait_for_file": provider},
            {"finish": {"reason": "tool-calls"}},
        ],
        [{"text": "All done"}],
        max_active_tools=cap,
    )
    await h.client.prompt(sid, "Go")
    expected = min(5, cap)
    await h.until(lambda: h.gate.active == expected)
    assert len(h.requests()) == 1  # the provider is still streaming
    h.open_gate("provider")
    await h.until(lambda: h.gate.active == expected and len(h.requests()) == 1)
    await asyncio.sleep(0.3)
    assert len(h.requests()) == 1  # the stream ended, but tools have not settled
    h.open_gate("tools")
    await h.client.wait_idle(sid, timeout=30)
    assert h.gate.peak == expected
    assert sorted(h.gate.started) == ["0", "1", "2", "3", "4"]
    assert len(h.requests()) == 2


async def test_a_worker_runs_the_drain_unsandboxed_unless_asked(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        queue, tools = h.client.task_queue, registry(h.gate)
        other = f"{queue}-sandboxed"
        async with build_worker(
            h.client.temporal, h.store, task_queue=other, tools=tools, sandboxed=True
        ) as sandboxed:
            assert isinstance(
                sandboxed.workers[0].config()["workflow_runner"], SandboxedWorkflowRunner
            )
        default = build_worker(h.client.temporal, h.store, task_queue=queue, tools=tools)
        assert isinstance(default.workers[0].config()["workflow_runner"], UnsandboxedWorkflowRunner)
        # Far above the SDK's 100 slots, which fifty busy sessions fill (then no eager start).
        assert default.workers[0].config()["max_concurrent_activities"] == 1000
        sid = await h.session([call("call_1", text="hi")], [{"text": "done"}])
        async with default:
            await run(h, sid)
        types = await h.types(sid)
        assert types.count("session.tool.success") == 1
        assert types[-1] == "session.execution.succeeded"


async def _signals(h: Harness, sid: str) -> list[str]:
    history = await h.client._handle(sid).fetch_history()
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]


async def test_calls_durable_while_the_model_streams_are_signalled_together(h: Harness) -> None:
    provider = h.gate_file("provider")
    sid = await h.session(
        [*[call(f"call_{i}", text=str(i)) for i in range(3)], {"wait_for_file": provider}],
        [{"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(_tools_settled(h, sid, 3))
    assert len(h.requests()) == 1  # all three ran while the provider still streamed
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    assert await _signals(h, sid) == ["wake", "tools_ready"]


async def test_calls_durable_only_as_the_stream_ends_start_from_the_turn_result(
    h: Harness,
) -> None:
    sid = await h.session([call(f"call_{i}", text=str(i)) for i in range(3)], [{"text": "done"}])
    await run(h, sid)
    assert await _signals(h, sid) == ["wake"]
    types = await h.types(sid)
    assert types.count("session.tool.success") == 3 and len(h.requests()) == 2


def _tools_settled(h: Harness, sid: str, count: int) -> Any:
    async def settled() -> bool:
        types = await h.types(sid)
        return types.count("session.tool.success") == count

    return settled


async def test_repeated_call_ids_settle_against_their_own_message(h: Harness) -> None:
    """Catalogue P3: a call id reused across turns."""
    sid = await h.session(
        [call("tool_0", text="first")], [call("tool_0", text="second")], [{"text": "ok"}]
    )
    await run(h, sid)
    assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert len(h.requests()) == 3
    assert [a.tool("tool_0").state.structured["text"] for a in assistants[:2]] == [
        "first",
        "second",
    ]


async def test_unknown_tools_fail_for_the_model_and_the_turn_continues(h: Harness) -> None:
    """Catalogue P6: unknown events and tools."""
    sid = await h.session([call("call_1", "missing")], [{"text": "Recovered"}])
    await run(h, sid)
    first = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert first.tool("call_1").state.error.message == "Unknown tool: missing"
    assert len(h.requests()) == 2


async def test_tool_defects_are_returned_to_the_model(h: Harness) -> None:
    sid = await h.session([call("call_1", "defect")], [{"text": "ok"}])
    await run(h, sid)
    first = next(m for m in await h.messages(sid) if m.type == "assistant")
    error = first.tool("call_1").state.error
    assert (error.type, error.message) == ("unknown", "unexpected tool defect")
    assert assistant_events(await h.events(sid), first.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.ended",
    ]


async def test_a_raw_provider_failure_waits_for_started_tools(h: Harness) -> None:
    sid = await h.session(
        [call("call_1", text="x"), {"error": {"kind": "invalid_request", "message": "Bad"}}]
    )
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.type == "failed" and outcome.error.message == "Bad"
    first = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant_events(await h.events(sid), first.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.success",
        "session.step.failed",
    ]
    assert len(h.requests()) == 1


async def test_provider_errors_fail_the_step_visibly(h: Harness) -> None:
    sid = await h.session([{"text": "partial"}, {"provider_error": "Provider unavailable"}])
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.type == "failed"
    assert (outcome.error.type, outcome.error.message) == (
        "provider.unknown",
        "Provider unavailable",
    )
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.finish == "error" and assistant.content[0].text == "partial"


async def test_content_filter_fails_the_step_and_keeps_partial_text(h: Harness) -> None:
    sid = await h.session([{"text": "half an ans"}, {"finish": {"reason": "content-filter"}}])
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.error.message == "Provider blocked the response"
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.error.type == "provider.content-filter"
    assert assistant.content[0].text == "half an ans"
    assert "session.step.ended" not in await h.types(sid)


async def test_a_stream_protocol_violation_fails_the_drain_with_its_text(h: Harness) -> None:
    sid = await h.session(
        [
            {"event": {"kind": "text-start", "id": "text-1"}},
            {"event": {"kind": "text-start", "id": "text-2"}},
        ]
    )
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.type == "failed"
    assert outcome.error.message == "text start before end: text-2"


async def test_transport_failures_before_output_retry_with_the_same_message(h: Harness) -> None:
    """Catalogue P8: provider errors mid-stream."""
    sid = await h.session(
        [{"error": {"kind": "transport", "message": "Disconnected"}}], [{"text": "Recovered"}]
    )
    await run(h, sid)
    types = await h.types(sid)
    assert types.count("session.retry.scheduled") == 1
    assert types.count("session.step.started") == 2
    assistants = [m for m in await h.messages(sid) if m.type == "assistant"]
    assert len(assistants) == 1 and assistants[0].finish == "stop"
    assert assistants[0].content[0].text == "Recovered"
    retry = next(e for e in await h.events(sid) if e.type == "session.retry.scheduled")
    assert retry.data["attempt"] == 2 and retry.data["error"]["type"] == "provider.transport"


async def test_non_retryable_failures_are_not_retried(h: Harness) -> None:
    sid = await h.session([{"error": {"kind": "invalid_request", "message": "Invalid request"}}])
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.error.type == "provider.invalid-request"
    assert "session.retry.scheduled" not in await h.types(sid)
    assert len(h.requests()) == 1


async def test_hosted_tools_without_a_result_fail_the_step(h: Harness) -> None:
    sid = await h.session(
        [
            UNANSWERED_SEARCH,
            {"eof": True},
        ],
    )
    await h.client.prompt(sid, "Go", wake=False)
    outcome = await h.client.resume(sid)
    assert outcome.error.message == "Provider did not return a tool result"
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.error.type == "tool.result-missing"
    assert assistant_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.failed",
    ]


async def test_an_unresolved_hosted_tool_still_allows_one_clean_step_end(h: Harness) -> None:
    sid = await h.session(
        [
            UNANSWERED_SEARCH,
            {"finish": {"reason": "stop"}},
        ],
    )
    await h.client.prompt(sid, "Go", wake=False)
    assert (await h.client.resume(sid)).type == "succeeded"
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.tool("ws_1").state.error.type == "tool.result-missing"
    assert assistant_events(await h.events(sid), assistant.id)[-2:] == [
        "session.tool.failed",
        "session.step.ended",
    ]


async def test_hosted_tool_results_replay_inline(h: Harness) -> None:
    sid = await h.session(
        [
            {
                "hosted_tool": {
                    "id": "ws_1",
                    "name": "web_search",
                    "input": {"query": "x"},
                    "result": {"hits": 1},
                    "metadata": {"itemId": "ws_1"},
                }
            },
            {"finish": {"reason": "stop"}},
        ],
        [{"text": "next"}],
    )
    await run(h, sid)
    await h.client.prompt(sid, "Again")
    await h.client.wait_idle(sid)
    second = h.requests()[1]
    assert h.roles(second) == ["user", "assistant", "user"]
    parts = second["messages"][1]["content"]
    assert [part["type"] for part in parts] == ["tool-call", "tool-result"]
    assert parts[1]["output"] == {"hits": 1}
    assert parts[0]["provider_metadata"] == {"scripted": {"itemId": "ws_1"}}


async def test_the_last_step_disables_tools(h: Harness) -> None:
    sid = await h.session(
        [call("call_1", text="done")],
        [call("call_2", text="forbidden"), {"text": "summary"}],
        max_steps=2,
    )
    await run(h, sid)
    first, second = h.requests()
    assert first["tool_choice"] is None and first["tools"]
    assert second["tool_choice"] == "none" and second["tools"] == []
    assert "MAXIMUM STEPS REACHED" in second["messages"][-1]["content"][0]["text"]
    last = [m for m in await h.messages(sid) if m.type == "assistant"][-1]
    assert last.tool("call_2").state.status == "error"
    assert len(h.requests()) == 2


async def test_steering_prompts_join_the_active_turn(h: Harness) -> None:
    gate = h.gate_file("provider")
    sid = await h.session([{"wait_for_file": gate}, {"text": "working"}], [{"text": "changed"}])
    await h.client.prompt(sid, "Start working")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Change direction")
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 2
    texts = [m["content"][0]["text"] for m in requests[1]["messages"] if m["role"] == "user"]
    assert texts == ["Start working", "Change direction"]


async def test_queued_prompts_run_one_at_a_time_in_order(h: Harness) -> None:
    gate = h.gate_file("provider")
    sid = await h.session(
        [{"wait_for_file": gate}, {"text": "one"}], [{"text": "two"}], [{"text": "three"}]
    )
    await h.client.prompt(sid, "First")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Second", delivery="queue")
    await h.client.prompt(sid, "Third", delivery="queue")
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    users = [
        [m["content"][0]["text"] for m in r["messages"] if m["role"] == "user"]
        for r in h.requests()
    ]
    assert users == [["First"], ["First", "Second"], ["First", "Second", "Third"]]


async def test_interrupting_a_tool_settles_the_step_durably(h: Harness) -> None:
    sid = await h.session([call("call_1", "gate", gate=h.gate_file("never"))], [{"text": "x"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assert (await h.client.interrupt(sid)).status == "idle"
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    tool = assistant.tool("call_1")
    assert (tool.state.error.type, tool.state.error.message) == (
        "aborted",
        "Tool execution interrupted",
    )
    assert assistant.error.message == "Step interrupted"
    types = await h.types(sid)
    assert types.count("session.step.failed") == 1 and "session.step.ended" not in types
    assert types[-1] == "session.execution.interrupted"
    assert h.gate.active == 0


async def test_interrupting_a_streaming_turn_keeps_partial_text_and_pending_input(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"text": "partial answer"}, {"wait_for_file": h.gate_file("never")}],
        [{"text": "resumed"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 1)
    await asyncio.sleep(0.2)
    await h.client.prompt(sid, "Later", delivery="queue")
    assert await h.client.interrupt(sid)
    await h.client.wait_idle(sid, timeout=30)
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.content[0].text == "partial answer"
    assert (assistant.finish, assistant.error.message) == ("error", "Step interrupted")
    assert [i.prompt.text for i in await h.store.inputs.pending(sid)] == ["Later"]
    assert len(h.requests()) == 1
    outcome = await h.client.resume(sid)
    assert outcome.type == "succeeded"
    users = [m["content"][0]["text"] for m in h.requests()[1]["messages"] if m["role"] == "user"]
    assert users == ["Go", "Later"]


async def test_interrupt_while_idle_does_nothing(h: Harness) -> None:
    sid = await h.session([{"text": "x"}])
    assert (await h.client.interrupt(sid)).status == "idle"
    await run(h, sid)
    assert (await h.client.interrupt(sid)).status == "idle"
    assert (await h.types(sid)).count("session.execution.interrupted") == 0


async def test_concurrent_resumes_join_one_provider_run(h: Harness) -> None:
    """Catalogue S9: a duplicate prompt or start."""
    sid = await h.session([{"wait_ms": 300}, {"text": "once"}])
    await h.client.prompt(sid, "Go", wake=False)
    first, second = await asyncio.gather(h.client.resume(sid), h.client.resume(sid))
    assert first.type == second.type == "succeeded"
    assert first.execution_id == second.execution_id
    assert len(h.requests()) == 1


async def test_a_wake_with_nothing_pending_makes_no_request(h: Harness) -> None:
    sid = await h.session([{"text": "x"}])
    await h.client.wake(sid)
    await asyncio.sleep(0.5)
    await h.client.wait_idle(sid)
    assert h.requests() == []
    types = await h.types(sid)
    assert types.count("session.execution.started") == types.count("session.execution.succeeded")


async def test_wakes_during_a_drain_coalesce_into_one_busy_period(h: Harness) -> None:
    """Reference §7.1 #8: 3 concurrent wakes during drain #1 make exactly 2 drains. Here a
    drain is a pass of the busy period's drain loop, each but the first opened by
    ``prepare_drain`` (the first by ``claim_and_prepare``): the wakes coalesce into one
    follow-up pass, in the same busy period."""
    gate = h.gate_file("provider")
    sid = await h.session(
        [{"wait_for_file": gate}, {"text": "a"}], [{"text": "b"}], [{"text": "c"}], [{"text": "d"}]
    )
    await h.client.prompt(sid, "One")
    await h.until(lambda: len(h.requests()) == 1)
    for _ in range(3):
        await h.client.prompt(sid, "More", delivery="queue", wake=False)
    await asyncio.gather(*(h.client.wake(sid) for _ in range(3)))
    await h.until(_wake_pending(h, sid))  # taken while drain #1 still streams
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    types = await h.types(sid)
    assert types.count("session.execution.started") == 1
    assert types.count("session.execution.succeeded") == 1
    assert len(h.requests()) == 4
    passes = _local(await h.client._handle(sid).fetch_history())
    assert (passes.count("claim_and_prepare"), passes.count("prepare_drain")) == (1, 1)


async def test_a_wake_racing_a_failure_starts_exactly_one_successor(h: Harness) -> None:
    gate = h.gate_file("provider")
    sid = await h.session(
        [{"wait_for_file": gate}, {"error": {"kind": "auth", "message": "Bad key"}}],
        [{"text": "second period"}],
    )
    await h.client.prompt(sid, "One")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Two", delivery="queue")
    h.open_gate("provider")
    await h.until(lambda: len(h.requests()) == 2)
    await h.client.wait_idle(sid, timeout=30)
    types = await h.types(sid)
    assert types.count("session.execution.started") == 2
    assert types.count("session.execution.failed") == 1
    assert types.count("session.execution.succeeded") == 1


async def test_the_temporal_ui_shows_the_session_and_its_current_work(h: Harness) -> None:
    sid = await h.session([call("call_1", "gate", gate=h.gate_file("ui"))], [{"text": "x"}])
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    handle = h.client._handle(sid)
    summary = await (await handle.describe()).static_summary()
    assert summary is not None and sid in summary and "scripted/" in summary
    assert str(h.workspace) in summary
    metadata = await handle.query("__temporal_workflow_metadata")
    assert "running gate" in metadata.current_details
    history = await handle.fetch_history()
    summaries = [
        e.user_metadata.summary.data.decode()
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert any("turn 1 · step 1" in s for s in summaries)
    assert any("gate call_1" in s for s in summaries)
    h.open_gate("ui")
    await h.client.wait_idle(sid)


async def test_the_step_records_the_files_its_tools_changed(h: Harness) -> None:
    sid = await h.session(
        [call("w1", "write", path="notes/out.txt", content="hello"), call("r1", "read", path="x")],
        [{"text": "written"}],
    )
    (h.workspace / "x").write_text("x")
    await run(h, sid)
    assert (h.workspace / "notes" / "out.txt").read_text() == "hello"
    ended = [e for e in await h.events(sid) if e.type == "session.step.ended"]
    assert ended[0].data["files"] == ["notes/out.txt"]
    assert ended[1].data["files"] == []


async def test_a_large_tool_output_is_cut_for_the_model_and_kept_whole_in_the_store(
    h: Harness,
) -> None:
    """Catalogue D1: oversized tool output."""
    command = "python3 -c \"print('y' * 200000)\""
    sid = await h.session(
        [call("b1", "bash", command=command)], [{"text": "seen"}], permissions=ALLOW_BASH
    )
    await run(h, sid)
    success = next(e for e in await h.events(sid) if e.type == "session.tool.success")
    shown = success.data["content"][0]["text"]
    assert len(shown.encode()) < 51_000 and "[truncated:" in shown
    assert success.data["output"].count("y") == 200_000
    sent = h.requests()[1]["messages"][-1]["content"][0]["output"]
    assert "[truncated:" in sent and len(sent) < 51_000
    history = await h.client._handle(sid).fetch_history()
    assert max(len(e.SerializeToString()) for e in history.events) < 8_000


@pytest.mark.fault
async def test_100_mb_of_binary_tool_output_keeps_payloads_small_and_the_row_cut(
    h: Harness,
) -> None:
    """Catalogue D1: a tool writes 100 MB of random bytes (invalid UTF-8, NUL bytes) through a
    drain. No Temporal payload carries it: every history event stays < 8 kB, so no activity
    result comes near the 256 kB warning. The event row keeps the model's view and the store's
    view, each cut at its cap with the marker counting the cut bytes, as normalized text."""
    command = "head -c 100000000 /dev/urandom"
    sid = await h.session(
        [call("b1", "bash", command=command)], [{"text": "seen"}], permissions=ALLOW_BASH
    )
    await run(h, sid)
    success = next(e for e in await h.events(sid) if e.type == "session.tool.success")
    shown, kept = success.data["content"][0]["text"], success.data["output"]
    assert success.data["structured"]["output_bytes"] == 100_000_000
    for view, cap in ((shown, 50_000), (kept, 1_000_000)):
        assert "\n… [truncated: " in view and len(view.encode()) < cap + 100
        assert "\x00" not in view and "\ufffd" in view
    sent = h.requests()[1]["messages"][-1]["content"][0]["output"]
    assert "[truncated:" in sent and len(sent) < 51_000
    history = await h.client._handle(sid).fetch_history()
    assert max(len(e.SerializeToString()) for e in history.events) < 8_000


def _scheduled(history: Any) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


def _local(history: Any) -> list[str]:
    """The local activities a history recorded, in order (from their markers)."""
    types = []
    for e in history.events:
        marker = e.marker_recorded_event_attributes
        if e.HasField("marker_recorded_event_attributes") and "data" in marker.details:
            types.append(json.loads(marker.details["data"].payloads[0].data)["activity_type"])
    return types


async def test_a_free_claim_is_taken_inside_the_first_workflow_task(h: Harness) -> None:
    sid = await h.session([{"text": "hi"}])
    await run(h, sid)
    history = await h.client._handle(sid).fetch_history()
    assert "acquire_claim" not in _scheduled(history)  # a local activity: no server round trip
    # The claim and the first drain's preparation are one local activity (one activation);
    # the step without tools ends with its turn, so no finish_step follows it.
    assert _local(history) == ["claim_and_prepare", "finish_execution"]
    assert "session.execution.started" in await h.types(sid)


async def test_a_run_ends_with_its_busy_period_and_the_next_prompt_starts_another(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "one"}], [{"text": "two"}])
    await run(h, sid)
    handle = h.client._handle(sid)
    await h.until(_closed(h, sid))
    first = await handle.fetch_history()
    assert not any(e.HasField("timer_started_event_attributes") for e in first.events)
    await run(h, sid, "Again")
    assert [m.text for m in await h.messages(sid) if m.type == "user"] == ["Go", "Again"]
    query = f"WorkflowId = 'session-{sid}'"

    async def two_runs() -> bool:  # visibility is eventually consistent
        return len({e.run_id async for e in h.client.temporal.list_workflows(query)}) == 2

    await h.until(two_runs)


def _closed(h: Harness, sid: str) -> Any:
    async def closed() -> bool:
        description = await h.client._handle(sid).describe()
        return description.status is not None and description.status.name == "COMPLETED"

    return closed


async def test_the_settled_step_answers_what_is_pending_without_another_activity(
    h: Harness,
) -> None:
    sid = await h.session([call("call_1", text="hi")], [{"text": "done"}])
    await run(h, sid)
    history = await h.client._handle(sid).fetch_history()
    recorded = b"".join(e.SerializeToString() for e in history.events)
    assert b"finish_step" in recorded  # local activities are recorded by type
    assert b"pending_inputs" not in recorded


async def test_a_held_claim_is_waited_for_by_the_retrying_activity(h: Harness) -> None:
    sid = await h.session([{"text": "hi"}])
    # Released early; the retry still waits for the lease it was told about (2 s).
    other = await h.store.claims.acquire(sid, "exec_other", "owner-other", lease_ms=2_000)
    await h.client.prompt(sid, "Go")
    await h.until(_phase(h, sid, "claiming"))
    assert h.requests() == []
    released_ms = int(time.time() * 1000)
    await h.store.claims.release(other)
    await h.client.wait_idle(sid, timeout=30)
    history = await h.client._handle(sid).fetch_history()
    assert _scheduled(history)[0] == "acquire_claim"
    events = await h.events(sid)
    assert events[-1].type == "session.execution.succeeded" and len(h.requests()) == 1
    # Nothing of the busy period began before the release: it waited for the claim.
    (started,) = [e for e in events if e.type == "session.execution.started"]
    assert started.created >= released_ms


async def test_an_interrupt_while_claiming_ends_the_busy_period_without_a_turn(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "never"}])
    other = await h.store.claims.acquire(sid, "exec_other", "owner-other", lease_ms=60_000)
    await h.client.prompt(sid, "Go")
    await h.until(_phase(h, sid, "claiming"))
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=20)
    assert h.requests() == []
    assert "session.execution.started" not in await h.types(sid)
    await h.store.claims.release(other)


def _wake_pending(h: Harness, sid: str) -> Any:
    async def pending() -> bool:
        status = await h.client.status(sid)
        return status.drain is not None and status.drain.pending_wake

    return pending


def _phase(h: Harness, sid: str, phase: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        status = await h.client.status(sid)
        return status.drain is not None and status.drain.phase == phase

    return check


async def test_an_interrupt_during_a_retry_backoff_settles_the_step(h: Harness) -> None:
    sid = await h.session(
        [{"error": {"kind": "transport", "message": "Disconnected"}}], [{"text": "late"}]
    )
    await h.client.prompt(sid, "Go")
    await h.until(_phase(h, sid, "retrying"))
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=20)
    types = await h.types(sid)
    tail = [t for t in types if t.startswith(("session.step", "session.retry", "session.exec"))]
    assert tail[-4:] == [
        "session.step.started",
        "session.retry.scheduled",
        "session.step.failed",
        "session.execution.interrupted",
    ]
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.error.message == "Step interrupted" and assistant.finish == "error"
    assert len(h.requests()) == 1
