"""Reference §7.2 (the runner test catalogue) on the real drain, on both databases.

Each test names its catalogue case (``test_<n>_...``). Cases about compaction, context baselines,
permissions, agents and title generation are out of scope; so is 80 (30 s of real retry waiting).
Adapted to this implementation: events are ``session.<name>`` with snake_case fields, the scripted
model is ``scripted/<script>`` (provider metadata key ``scripted``), the tools are ``echo``,
``sleep``, ``fail``, ``defect`` and ``gate``, and stream deltas are stored events that the
projections ignore (so "0 delta rows" becomes "the history holds only the full value").
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from activities.history import DEFAULT_SYSTEM
from sessionflow.client import ClientEvent
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, SessionError
from sessionflow.models.messages import AssistantMessage, ReasoningPart, TextPart
from store import open_store
from store.events import StoredEvent, Synced
from tests.invariants import serialized
from tests.workflows.harness import Harness, call
from tests.workflows.tools import Gate, registry

PROVIDER_UNAVAILABLE = {"error": {"kind": "transport", "message": "Provider unavailable"}}
INTERRUPTED_TOOL = SessionError(type="aborted", message="Tool execution interrupted")
INTERRUPTED_STEP = SessionError(type="aborted", message="Step interrupted")
RESULT_MISSING = SessionError(
    type="tool.result-missing", message="Provider did not return a tool result"
)
TRANSPORT = SessionError(type="provider.transport", message="Provider unavailable")


# --- helpers ------------------------------------------------------------------------------------


def raw(kind: str, **fields: object) -> dict[str, Any]:
    """One provider stream event, exactly as given."""
    return {"event": {"kind": kind, **fields}}


def hosted_call(call_id: str = "ws_1", **fields: object) -> dict[str, Any]:
    """A provider-executed ``web_search`` call without its result."""
    return raw(
        "tool-call",
        call_id=call_id,
        name="web_search",
        input={"query": "x"},
        provider_executed=True,
        **fields,
    )


def users(request: dict[str, Any]) -> list[str]:
    return [m["content"][0]["text"] for m in request["messages"] if m["role"] == "user"]


def step_events(events: list[ClientEvent], assistant_id: str) -> list[str]:
    """The settlement events of one assistant message (no fragments, no deltas)."""
    return [
        e.type
        for e in events
        if e.data.get("assistant_message_id") == assistant_id
        and not e.type.endswith(".delta")
        and not e.type.startswith(("session.text.", "session.reasoning.", "session.tool.input."))
    ]


async def assistants(h: Harness, sid: str) -> list[AssistantMessage]:
    return [m for m in await h.messages(sid) if isinstance(m, AssistantMessage)]


async def only_assistant(h: Harness, sid: str) -> AssistantMessage:
    found = await assistants(h, sid)
    assert len(found) == 1, found
    return found[0]


async def resume(h: Harness, sid: str, *texts: str) -> Any:
    """Record prompts without waking (``resume:false``), then resume explicitly."""
    for text in texts:
        await h.client.prompt(sid, text, wake=False)
    return await h.client.resume(sid)


async def run(h: Harness, sid: str, text: str = "Go") -> None:
    await h.client.prompt(sid, text)
    await h.client.wait_idle(sid, timeout=30)


async def replayed(h: Harness, sid: str) -> list[Any]:
    """The history rebuilt by replaying the durable log into a fresh store."""
    page = await h.store.events.read_after(sid, -1, limit=100_000)
    log = [serialized(e) for e in page.events]
    copy = await open_store(f"sqlite+aiosqlite:///{h.root / f'replay-{uuid.uuid4().hex}.db'}")
    try:
        await copy.events.replay_all(log)
        return await copy.sessions.messages(sid)
    finally:
        await copy.close()


async def assert_replays(h: Harness, sid: str) -> None:
    assert await replayed(h, sid) == await h.messages(sid)


async def first_event(h: Harness, sid: str, type: str) -> ClientEvent:
    found: list[ClientEvent] = []

    async def present() -> bool:
        found[:] = [e for e in await h.events(sid) if e.type == type]
        return bool(found)

    await h.until(present)
    return found[0]


class Follower:
    """Follows a session's log from before its turn; keeps what arrived after ``log.synced``."""

    def __init__(self, h: Harness, sid: str) -> None:
        self.h, self.sid = h, sid
        self.live: list[StoredEvent] = []
        self.synced = asyncio.Event()
        self.task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        async for item in self.h.store.events.log(self.sid, follow=True):
            if isinstance(item, Synced):
                self.synced.set()
                continue
            if self.synced.is_set():
                self.live.append(item)
            if item.data.type in ("session.execution.succeeded", "session.execution.failed"):
                return

    async def done(self) -> list[StoredEvent]:
        await asyncio.wait_for(self.task, 30)
        return self.live


# --- turns and history --------------------------------------------------------------------------


async def test_02_a_default_prompt_starts_a_turn_and_an_empty_response_adds_nothing(
    h: Harness,
) -> None:
    sid = await h.session([{"eof": True}], [{"text": "never"}])
    await run(h, sid, "Hello")
    assert len(h.requests()) == 1
    assert [(m.type, m.text) for m in await h.messages(sid)] == [("user", "Hello")]
    types = await h.types(sid)
    assert not [t for t in types if t.startswith("session.step.")]
    assert types[-1] == "session.execution.succeeded"


async def test_03_one_request_with_registry_tools_from_chronological_user_history(
    h: Harness,
) -> None:
    sid = await h.session([{"text": "ok"}], [{"text": "never"}])
    assert (await resume(h, sid, "First", "Second")).type == "succeeded"
    requests = h.requests()
    assert len(requests) == 1
    # The registry's tools, and ``task``: the built-in agents include subagents.
    assert [t["name"] for t in requests[0]["tools"]] == [*registry(Gate()).names(), "task"]
    assert requests[0]["tool_choice"] is None
    assert [(m["role"], m["content"]) for m in requests[0]["messages"]] == [
        ("user", [{"type": "text", "text": "First"}]),
        ("user", [{"type": "text", "text": "Second"}]),
    ]


async def test_32_projects_reasoning_and_hosted_tools_without_executing_or_continuing(
    h: Harness,
) -> None:
    source = {"source": "provider"}
    sid = await h.session(
        [
            {"reasoning": "Thinking", "metadata": {"signature": "sig_1"}},
            raw("tool-call", call_id="w_1", name="write", input={}, provider_executed=True),
            raw("tool-error", call_id="w_1", name="write", message="Denied"),
            raw("tool-result", call_id="w_1", name="write", result="late", is_error=True),
            {
                "hosted_tool": {
                    "id": "ws_1",
                    "name": "web_search",
                    "input": {"query": "x"},
                    "result": "Found it",
                    "metadata": source,
                }
            },
            {
                "finish": {
                    "reason": "tool-calls",
                    "usage": {"input": 10, "output": 4, "reasoning": 1, "cache_read": 2},
                }
            },
        ],
        [{"text": "never"}],
    )
    assert (await resume(h, sid, "Go")).type == "succeeded"
    assert len(h.requests()) == 1
    assistant = await only_assistant(h, sid)
    tokens = {"input": 8, "output": 3, "reasoning": 1, "cache": {"read": 2, "write": 0}}
    assert assistant.finish == "tool-calls"
    assert assistant.tokens is not None and assistant.tokens.model_dump() == tokens
    reasoning = assistant.content[0]
    assert (reasoning.type, reasoning.text, reasoning.state) == (
        "reasoning",
        "Thinking",
        {"signature": "sig_1"},
    )
    write = assistant.tool("w_1")
    assert write is not None and write.executed
    assert write.state.status == "error"
    assert write.state.error == SessionError(type="tool.execution", message="Denied")
    search = assistant.tool("ws_1")
    assert search is not None and search.executed
    assert search.state.status == "completed"
    assert (search.provider_state, search.provider_result_state) == (source, source)
    assert search.state.structured == {}
    assert [c.model_dump() for c in search.state.content] == [{"type": "text", "text": "Found it"}]
    assert search.state.result == "Found it"
    events = await h.events(sid)
    assert step_events(events, assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.tool.called",
        "session.tool.success",
        "session.step.ended",
    ]
    ended = next(e for e in events if e.type == "session.step.ended")
    assert ended.data["tokens"] == tokens
    await assert_replays(h, sid)


async def test_35_reasoning_metadata_is_replayed_to_the_same_model_only(h: Harness) -> None:
    sid = await h.session(
        [
            {"reasoning": "First thought", "metadata": {"signature": "sig_1"}},
            raw("reasoning-start", id="r_2", metadata={"itemId": "rs_1"}),
            raw("reasoning-delta", id="r_2", delta="Second thought"),
            raw("reasoning-end", id="r_2", metadata={"reasoningEncryptedContent": "encrypted"}),
            {"text": "Answer"},
        ],
        [{"text": "Again"}],
    )
    await run(h, sid, "Go")
    first = await only_assistant(h, sid)
    second_state = {"itemId": "rs_1", "reasoningEncryptedContent": "encrypted"}
    reasoning = [p for p in first.content if isinstance(p, ReasoningPart)]
    assert [p.state for p in reasoning] == [{"signature": "sig_1"}, second_state]
    await run(h, sid, "More")
    request = h.requests()[1]
    assert h.roles(request) == ["user", "assistant", "user"]
    assert request["messages"][1]["content"] == [
        {
            "type": "reasoning",
            "text": "First thought",
            "provider_metadata": {"scripted": {"signature": "sig_1"}},
        },
        {
            "type": "reasoning",
            "text": "Second thought",
            "provider_metadata": {"scripted": second_state},
        },
        {"type": "text", "text": "Answer"},
    ]
    # Another model gets the reasoning as plain text, without the provider's state.
    other = h.script([], [], [{"text": "Switched"}], name="other.json")
    await h.store.events.publish(ev.ModelSelected(session_id=sid, model=ModelRef.parse(other)))
    await run(h, sid, "Third")
    (switched,) = h.requests("other.json")
    assert switched["messages"][1]["content"] == [
        {"type": "text", "text": "First thought"},
        {"type": "text", "text": "Second thought"},
        {"type": "text", "text": "Answer"},
    ]


async def test_17_a_model_selected_while_the_attempt_runs_applies_only_from_the_next(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"wait_for_file": h.gate_file("provider")}, {"text": "sampled"}], [{"text": "never"}]
    )
    sampled = (await h.client.session(sid)).model
    assert sampled is not None
    other = h.script([], [{"text": "switched"}], name="other.json")
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 1)  # the attempt has resolved its model
    await h.store.events.publish(ev.ModelSelected(session_id=sid, model=ModelRef.parse(other)))
    h.open_gate("provider")  # nothing of the step is published before this
    await h.client.wait_idle(sid, timeout=30)
    (request,) = h.requests()
    assert ModelRef.model_validate(request["model"]) == sampled
    assert h.requests("other.json") == []
    assistant = await only_assistant(h, sid)
    (text,) = assistant.content
    assert assistant.model == sampled
    assert isinstance(text, TextPart) and text.text == "sampled"
    started = await first_event(h, sid, "session.step.started")
    assert ModelRef.model_validate(started.data["model"]) == sampled
    await run(h, sid, "Again")  # the selection did take: the next attempt resolves it
    (switched,) = h.requests("other.json")
    assert ModelRef.model_validate(switched["model"]) == ModelRef.parse(other)


async def test_34_a_model_switch_while_a_tool_runs_applies_to_the_continuation_turn(
    h: Harness,
) -> None:
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session(
        [call("call_1", "gate", text="ran", gate=h.gate_file("tool"))], [{"text": "never"}]
    )
    replacement = h.script([], [{"text": "continued"}], name="replacement.json")
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    selected = ev.ModelSelected(session_id=sid, model=ModelRef.parse(replacement))
    await h.store.events.publish(selected)
    (h.workspace / "AGENTS.md").write_text("Replacement context")
    h.open_gate("tool")
    await h.client.wait_idle(sid, timeout=30)
    (first,) = h.requests()
    (second,) = h.requests("replacement.json")
    assert ModelRef.model_validate(second["model"]) == ModelRef.parse(replacement)
    baseline = [
        DEFAULT_SYSTEM,
        '<instructions source="AGENTS.md">\nInitial context\n</instructions>',
    ]
    assert first["system"] == second["system"] == baseline
    assert h.roles(second) == ["user", "assistant", "tool", "system"]
    changed = second["messages"][3]["content"][0]["text"]
    assert "Replacement context" in changed
    (text,) = (await assistants(h, sid))[-1].content
    assert isinstance(text, TextPart) and text.text == "continued"


async def test_91_sequential_text_fragments_are_separate_content_parts(h: Harness) -> None:
    sid = await h.session([{"text": "First"}, {"text": "Second"}])
    assert (await resume(h, sid, "Go")).type == "succeeded"
    assistant = await only_assistant(h, sid)
    assert [(p.type, p.text) for p in assistant.content] == [
        ("text", "First"),
        ("text", "Second"),
    ]
    await assert_replays(h, sid)


# --- steer and queue ----------------------------------------------------------------------------


async def test_45_queued_input_is_promoted_after_the_steering_turn_ends(h: Harness) -> None:
    sid = await h.session([{"text": "steered"}], [{"text": "queued"}], [{"text": "never"}])
    await h.client.prompt(sid, "Queued", delivery="queue", wake=False)
    await h.client.prompt(sid, "Steer", wake=False)
    assert (await h.client.resume(sid)).type == "succeeded"
    assert [users(r) for r in h.requests()] == [["Steer"], ["Steer", "Queued"]]
    assert await h.store.inputs.pending(sid) == []


async def test_46_steers_are_promoted_before_the_next_queued_input(h: Harness) -> None:
    sid = await h.session(
        [{"wait_for_file": h.gate_file("one")}, {"text": "one"}],
        [{"wait_for_file": h.gate_file("two")}, {"text": "two"}],
        [{"text": "three"}],
        [{"text": "four"}],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "Start")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Queue first", delivery="queue")
    await h.client.prompt(sid, "Queue second", delivery="queue")
    h.open_gate("one")
    await h.until(lambda: len(h.requests()) == 2)
    await h.client.prompt(sid, "Steer one")
    await h.client.prompt(sid, "Steer two")
    h.open_gate("two")
    await h.client.wait_idle(sid, timeout=30)
    steered = ["Start", "Queue first", "Steer one", "Steer two"]
    assert [users(r) for r in h.requests()] == [
        ["Start"],
        ["Start", "Queue first"],
        steered,
        [*steered, "Queue second"],
    ]
    assert (await h.types(sid)).count("session.execution.started") == 1


async def test_47_active_steers_coalesce_into_one_continuation_and_an_idle_wake_is_a_no_op(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"wait_for_file": h.gate_file("provider")}, {"text": "working"}],
        [{"text": "steered"}],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "Start")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Steer one")
    await h.client.prompt(sid, "Steer two")
    h.open_gate("provider")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 2
    assert users(requests[1]) == ["Start", "Steer one", "Steer two"]
    await h.client.wake(sid)
    await asyncio.sleep(0.5)
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 2


async def test_48_a_steer_accepted_while_the_turn_fails_runs_in_a_successor_period(
    h: Harness,
) -> None:
    sid = await h.session(
        [
            {"wait_for_file": h.gate_file("provider")},
            {"error": {"kind": "auth", "message": "Bad key"}},
        ],
        [{"text": "steered"}],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "One", wake=False)
    first = asyncio.create_task(h.client.resume(sid))
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Two")
    h.open_gate("provider")
    outcome = await first
    assert outcome.type == "failed"
    assert outcome.error == SessionError(type="provider.auth", message="Bad key")
    await h.until(lambda: len(h.requests()) == 2)
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 2 and users(requests[1]) == ["One", "Two"]
    executions = [t for t in await h.types(sid) if t.startswith("session.execution.")]
    assert executions == [
        "session.execution.started",
        "session.execution.failed",
        "session.execution.started",
        "session.execution.succeeded",
    ]
    assert await h.store.inputs.pending(sid) == []


async def test_71_a_promoted_steer_resets_the_step_allowance(h: Harness) -> None:
    sid = await h.session(
        [call("call_1", "gate", text="before", gate=h.gate_file("tool"))],
        [call("call_2", "gate", text="after")],
        [{"text": "done"}],
        [{"text": "never"}],
        max_steps=2,
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    await h.client.prompt(sid, "Steer")
    h.open_gate("tool")
    await h.client.wait_idle(sid, timeout=30)
    first, second, third = h.requests()
    assert first["tools"] and first["tool_choice"] is None
    # Step 2 would be the last; the steer promoted with it makes it step 1 again.
    assert users(second) == ["Go", "Steer"]
    assert second["tools"] and second["tool_choice"] is None
    assert third["tools"] == [] and third["tool_choice"] == "none"
    assert h.gate.started == ["before", "after"]


async def test_43_a_steer_accepted_during_an_interrupted_turn_waits_for_a_later_resume(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"text": "partial"}, {"wait_for_file": h.gate_file("never")}],
        [{"text": "resumed"}],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "Start")
    await h.until(lambda: len(h.requests()) == 1)
    await h.client.prompt(sid, "Steer")
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assert (await h.types(sid))[-1] == "session.execution.interrupted"
    assert len(h.requests()) == 1
    assert [i.prompt.text for i in await h.store.inputs.pending(sid) if i.prompt] == ["Steer"]
    assert (await h.client.resume(sid)).type == "succeeded"
    assert [users(r) for r in h.requests()] == [["Start"], ["Start", "Steer"]]
    assert await h.store.inputs.pending(sid) == []
    executions = [t for t in await h.types(sid) if t.startswith("session.execution.")]
    assert executions == [
        "session.execution.started",
        "session.execution.interrupted",
        "session.execution.started",
        "session.execution.succeeded",
    ]


# --- stale tools --------------------------------------------------------------------------------


@pytest.mark.parametrize("left", ["pending input (51)", "local (49)", "hosted (50)"])
# The prior process is hand-made, written under no claim, and its step never ends: the reference
# fails its tools as stale and leaves the step as it was.
@pytest.mark.breaks_invariants("I4", "I5")
async def test_51_tools_left_by_a_prior_process_fail_as_stale_before_continuing(
    h: Harness, left: str
) -> None:
    sid = await h.session([{"text": "Recovered"}])
    model = (await h.client.session(sid)).model
    assert model is not None
    receipt = await h.store.inputs.admit(sid, "Go")
    await h.store.events.publish(ev.PromptPromoted(session_id=sid, input_id=receipt.id))
    ids = {"session_id": sid, "assistant_message_id": "msg_prior"}
    name = "web_search" if "hosted" in left else "echo"
    prior: list[ev.Event] = [
        ev.StepStarted(**ids, agent="build", model=model),
        ev.ToolInputStarted(**ids, call_id="call_1", name=name),
    ]
    if "pending" in left:
        prior.append(ev.ToolInputEnded(**ids, call_id="call_1", text='{"text": "Par'))
    else:
        hosted = "hosted" in left
        prior.append(
            ev.ToolCalled(
                **ids,
                call_id="call_1",
                name=name,
                input={"text": "hi"},
                executed=hosted,
                state={"itemId": "ws_1"} if hosted else None,
            )
        )
    await h.store.events.publish_many(prior)

    assert (await h.client.resume(sid)).type == "succeeded"
    stale = SessionError(type="tool.stale", message=f"Tool execution interrupted: {name}")
    first = (await assistants(h, sid))[0]
    tool = first.tool("call_1")
    assert tool is not None and tool.state.status == "error" and tool.state.error == stale
    types = await h.types(sid)
    started = types.index("session.execution.started")
    assert types[started : started + 3] == [
        "session.execution.started",
        "session.tool.failed",
        "session.step.started",
    ]
    failed = next(e for e in await h.events(sid) if e.type == "session.tool.failed")
    assert failed.data["executed"] is ("hosted" in left)
    (request,) = h.requests()
    if "hosted" in left:
        assert h.roles(request) == ["user", "assistant"]
        parts = request["messages"][1]["content"]
        assert [(p["type"], p["provider_metadata"]) for p in parts] == [
            ("tool-call", {"scripted": {"itemId": "ws_1"}}),
            ("tool-result", {"scripted": {"itemId": "ws_1"}}),
        ]
        assert (parts[1]["is_error"], parts[1]["output"]) == (True, stale.message)
    else:
        assert h.roles(request) == ["user", "assistant", "tool"]
        (result,) = request["messages"][2]["content"]
        assert (result["call_id"], result["is_error"], result["output"]) == (
            "call_1",
            True,
            stale.message,
        )


# --- joining and failing ------------------------------------------------------------------------


async def test_57_one_failed_run_fans_out_to_its_joiners_and_a_later_resume_retries(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"wait_ms": 300}, {"error": {"kind": "invalid_request", "message": "Invalid request"}}],
        [{"text": "Recovered"}],
    )
    await h.client.prompt(sid, "Go", wake=False)
    first, second = await asyncio.gather(h.client.resume(sid), h.client.resume(sid))
    assert first == second
    assert first.type == "failed"
    assert first.error == SessionError(type="provider.invalid-request", message="Invalid request")
    assert len(h.requests()) == 1
    later = await h.client.resume(sid)
    assert later.type == "succeeded" and later.execution_id != first.execution_id
    assert len(h.requests()) == 2


async def test_73_provider_errors_before_any_step_start_create_the_failed_assistant(
    h: Harness,
) -> None:
    sid = await h.session([{"provider_error": "Provider unavailable"}], [{"text": "never"}])
    outcome = await resume(h, sid, "Go")
    error = SessionError(type="provider.unknown", message="Provider unavailable")
    assert outcome.type == "failed" and outcome.error == error
    assistant = await only_assistant(h, sid)
    assert (assistant.finish, assistant.error) == ("error", error)
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.step.failed",
    ]
    assert len(h.requests()) == 1


async def test_75_a_local_tool_settles_before_one_content_filter_step_failure(
    h: Harness,
) -> None:
    sid = await h.session(
        [call("call_1", text="hi"), {"finish": {"reason": "content-filter"}}],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    blocked = SessionError(type="provider.content-filter", message="Provider blocked the response")
    assert outcome.type == "failed" and outcome.error == blocked
    assistant = await only_assistant(h, sid)
    assert assistant.error == blocked
    tool = assistant.tool("call_1")
    assert tool is not None and tool.state.status == "completed"
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.success",
        "session.step.failed",
    ]
    assert len(h.requests()) == 1


async def test_76_context_overflow_after_durable_output_is_not_recovered(h: Harness) -> None:
    sid = await h.session(
        [
            {"text": "partial"},
            {"error": {"kind": "context_overflow", "message": "prompt too long"}},
        ],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    overflow = SessionError(type="provider.context-overflow", message="prompt too long")
    assert outcome.type == "failed" and outcome.error == overflow
    assistant = await only_assistant(h, sid)
    assert (assistant.finish, assistant.error) == ("error", overflow)
    assert [(p.type, p.text) for p in assistant.content] == [("text", "partial")]
    assert len(h.requests()) == 1
    assert "session.retry.scheduled" not in await h.types(sid)


async def test_77_raw_provider_failures_are_terminal_assistant_step_failures(h: Harness) -> None:
    sid = await h.session(
        [{"error": {"kind": "invalid_request", "message": "Invalid request"}}],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    invalid = SessionError(type="provider.invalid-request", message="Invalid request")
    assert outcome.type == "failed" and outcome.error == invalid
    assistant = await only_assistant(h, sid)
    assert (assistant.finish, assistant.error) == ("error", invalid)
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.step.failed",
    ]
    (replayed_assistant,) = [m for m in await replayed(h, sid) if m.type == "assistant"]
    assert (replayed_assistant.finish, replayed_assistant.error) == ("error", invalid)
    await assert_replays(h, sid)


async def test_56_a_64_hex_session_id_gives_its_64_characters_as_the_prompt_cache_key(
    h: Harness,
) -> None:
    model = h.script([{"text": "ok"}], [{"text": "never"}])
    ids = [f"ses_{uuid.uuid4().hex}{uuid.uuid4().hex}" for _ in range(2)]
    for sid in ids:
        await h.client.create_session(workspace=str(h.workspace), model=model, session_id=sid)
        await run(h, sid)
    keys = {r["session_id"]: r["prompt_cache_key"] for r in h.requests()}
    assert keys == {sid: sid.removeprefix("ses_") for sid in ids}
    assert [len(key) for key in keys.values()] == [64, 64]


# --- retries ------------------------------------------------------------------------------------


async def test_79_a_larger_provider_retry_after_delay_wins_over_the_backoff(h: Harness) -> None:
    """Catalogue P8: provider errors mid-stream."""
    sid = await h.session(
        [{"error": {"kind": "rate_limit", "message": "Slow down", "retry_after_ms": 2500}}],
        [{"text": "Recovered"}],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "Go")
    retry = await first_event(h, sid, "session.retry.scheduled")
    at = retry.data["at"]
    assert retry.data["attempt"] == 2
    assert retry.data["error"] == {
        "type": "provider.rate-limit",
        "message": "Slow down",
        "status": None,
    }
    # ``at`` = the workflow's clock when it scheduled the retry + 2500 ms (not the 2000 ms
    # backoff): that moment lies between the failed attempt's step start and the retry event.
    started = next(e for e in await h.events(sid) if e.type == "session.step.started")
    assert started.created - 20 <= at - 2500 <= retry.created + 20
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 2
    # The workflow waited on a durable timer of the provider's 2.5 s, not the 2 s backoff.
    timers = [
        e.timer_started_event_attributes.start_to_fire_timeout.ToMilliseconds()
        async for e in h.client._handle(sid).fetch_history_events()
        if e.HasField("timer_started_event_attributes")
    ]
    assert timers == [2500]
    steps = [e for e in await h.events(sid) if e.type == "session.step.started"]
    assert len(steps) == 2 and steps[1].created >= at - 20
    assert steps[0].data["assistant_message_id"] == steps[1].data["assistant_message_id"]
    assistant = await only_assistant(h, sid)
    assert (assistant.finish, assistant.retry, assistant.content[0].text) == (
        "stop",
        None,
        "Recovered",
    )


async def test_81_retry_attempts_count_against_the_step_allowance(h: Harness) -> None:
    sid = await h.session(
        [PROVIDER_UNAVAILABLE],
        [PROVIDER_UNAVAILABLE],
        [{"text": "never"}],
        max_steps=2,
    )
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error == TRANSPORT
    requests = h.requests()
    assert len(requests) == 2
    assert requests[1]["tool_choice"] == "none"  # the retry ran as the last allowed step
    types = await h.types(sid)
    assert types.count("session.retry.scheduled") == 1
    assert types.count("session.step.started") == 2
    assert types.count("session.step.failed") == 1
    assistant = await only_assistant(h, sid)
    assert (assistant.finish, assistant.error) == ("error", TRANSPORT)


# --- provider failures and tools ----------------------------------------------------------------


async def test_83_no_continuation_after_a_provider_error_follows_a_local_tool_call(
    h: Harness,
) -> None:
    sid = await h.session(
        [call("call_1", text="hi"), {"provider_error": "Provider unavailable"}],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    error = SessionError(type="provider.unknown", message="Provider unavailable")
    assert outcome.type == "failed" and outcome.error == error
    assistant = await only_assistant(h, sid)
    tool = assistant.tool("call_1")
    assert tool is not None and tool.state.status == "completed"
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.success",
        "session.step.failed",
    ]
    assert len(h.requests()) == 1


async def test_84_a_hosted_tool_fails_when_its_provider_errors_before_a_result(
    h: Harness,
) -> None:
    sid = await h.session(
        [hosted_call(), {"provider_error": "Provider unavailable"}], [{"text": "never"}]
    )
    outcome = await resume(h, sid, "Go")
    error = SessionError(type="provider.unknown", message="Provider unavailable")
    assert outcome.type == "failed" and outcome.error == error
    assistant = await only_assistant(h, sid)
    assert assistant.error == error
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.failed",
    ]
    tool = assistant.tool("ws_1")
    assert tool is not None and tool.state.status == "error"
    assert tool.state.error == INTERRUPTED_TOOL


async def test_85_a_tool_defect_is_kept_through_provider_failure_settlement(h: Harness) -> None:
    sid = await h.session(
        [call("call_1", "defect"), {"provider_error": "Provider unavailable"}],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error is not None
    assert outcome.error.message == "Provider unavailable"
    assistant = await only_assistant(h, sid)
    tool = assistant.tool("call_1")
    assert tool is not None and tool.state.status == "error"
    assert tool.state.error == SessionError(type="unknown", message="unexpected tool defect")
    assert step_events(await h.events(sid), assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.failed",
    ]
    assert len(h.requests()) == 1


async def test_88_local_and_hosted_tools_settle_before_one_raw_provider_failure(
    h: Harness,
) -> None:
    sid = await h.session(
        [call("call_local", "defect"), hosted_call("call_hosted"), PROVIDER_UNAVAILABLE],
        [{"text": "never"}],
    )
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error == TRANSPORT
    assistant = await only_assistant(h, sid)
    settled = [
        (e.type, e.data.get("call_id"))
        for e in await h.events(sid)
        if e.type in step_events([e], assistant.id)
    ]
    assert settled == [
        ("session.step.started", None),
        ("session.tool.called", "call_local"),
        ("session.tool.called", "call_hosted"),
        ("session.tool.failed", "call_local"),
        ("session.tool.failed", "call_hosted"),
        ("session.step.failed", None),
    ]
    hosted = assistant.tool("call_hosted")
    assert hosted is not None and hosted.state.status == "error"
    assert hosted.state.error == RESULT_MISSING
    assert assistant.error == TRANSPORT
    assert len(h.requests()) == 1


async def test_89_a_hosted_tool_left_unresolved_by_a_raw_stream_failure_fails(
    h: Harness,
) -> None:
    sid = await h.session([hosted_call(), PROVIDER_UNAVAILABLE], [{"text": "never"}])
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error == TRANSPORT
    assert len(h.requests()) == 1
    for history in (await h.messages(sid), await replayed(h, sid)):
        (assistant,) = [m for m in history if m.type == "assistant"]
        assert (assistant.finish, assistant.error) == ("error", TRANSPORT)
        tool = assistant.tool("ws_1")
        assert tool is not None and tool.state.status == "error"
        assert tool.state.error == RESULT_MISSING


# --- interrupts ---------------------------------------------------------------------------------


async def test_67_an_interrupted_stream_fails_its_blocked_local_tool_durably(
    h: Harness,
) -> None:
    sid = await h.session(
        [
            call("call_1", "gate", gate=h.gate_file("never")),
            {"wait_for_file": h.gate_file("stream")},  # never opened: the stream stays open
        ],
        [{"text": "after"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 1 and h.gate.active == 0
    for history in (await h.messages(sid), await replayed(h, sid)):
        (assistant,) = [m for m in history if m.type == "assistant"]
        tool = assistant.tool("call_1")
        assert tool is not None and tool.state.status == "error"
        assert tool.state.error == INTERRUPTED_TOOL
        assert (assistant.finish, assistant.error) == ("error", INTERRUPTED_STEP)
    events = await h.events(sid)
    assert step_events(events, assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.failed",
    ]
    assert events[-1].type == "session.execution.interrupted"
    await assert_replays(h, sid)
    assert (await h.client.resume(sid)).type == "succeeded"
    request = h.requests()[1]
    assert h.roles(request) == ["user", "assistant", "tool"]
    (result,) = request["messages"][2]["content"]
    assert (result["call_id"], result["is_error"], result["output"]) == (
        "call_1",
        True,
        INTERRUPTED_TOOL.message,
    )


async def test_69_interrupt_while_awaiting_tool_settlement_fails_tool_and_step(
    h: Harness,
) -> None:
    sid = await h.session(
        [
            call("call_1", "gate", gate=h.gate_file("never")),
            {"finish": {"reason": "tool-calls", "usage": {"input": 5, "output": 2}}},
        ],
        [{"text": "never"}],
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: h.gate.active == 1)

    async def awaiting_tools() -> bool:
        status = await h.client.status(sid)
        return status.drain is not None and status.drain.phase == "tools"

    await h.until(awaiting_tools)  # the stream has finished: only settlement is awaited
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assistant = await only_assistant(h, sid)
    tool = assistant.tool("call_1")
    assert tool is not None and tool.state.status == "error"
    assert tool.state.error == INTERRUPTED_TOOL
    assert (assistant.finish, assistant.error) == ("error", INTERRUPTED_STEP)
    events = await h.events(sid)
    assert step_events(events, assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.failed",
    ]
    failed = next(e for e in events if e.type == "session.step.failed")
    assert failed.data["tokens"] == {
        "input": 5,
        "output": 2,
        "reasoning": 0,
        "cache": {"read": 0, "write": 0},
    }
    assert events[-1].type == "session.execution.interrupted"
    assert len(h.requests()) == 1
    assert h.gate.active == 0
    await assert_replays(h, sid)


# --- fragments: deltas, failures, interrupts (92-100) -------------------------------------------

VALUE = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ!?"  # 64 chars: 32 x 2
TOOL_TEXT = json.dumps({"text": VALUE[: 64 - len('{"text": ""}')]})
DELTA_TYPES = {
    "text": "session.text.delta",
    "reasoning": "session.reasoning.delta",
    "tool input": "session.tool.input.delta",
}
KINDS = list(DELTA_TYPES)


def streamed(kind: str) -> list[dict[str, Any]]:
    """A turn that streams ``kind`` in 32 deltas."""
    if kind == "text":
        return [{"text": VALUE, "chunks": 32}]
    if kind == "reasoning":
        return [{"reasoning": VALUE, "chunks": 32}, {"text": "done"}]
    assert len(TOOL_TEXT) == 64
    return [
        raw("tool-input-start", id="call-1", name="echo"),
        *[
            raw("tool-input-delta", id="call-1", delta=TOOL_TEXT[i : i + 2])
            for i in range(0, 64, 2)
        ],
        raw("tool-input-end", id="call-1"),
        raw("tool-call", call_id="call-1", name="echo", input=TOOL_TEXT),
    ]


def partial(kind: str) -> list[dict[str, Any]]:
    """The first events of a turn that is cut off after a partial ``kind`` fragment."""
    if kind == "text":
        return [raw("text-start", id="t-1"), raw("text-delta", id="t-1", delta="Partial")]
    if kind == "reasoning":
        return [
            raw("reasoning-start", id="r-1"),
            raw("reasoning-delta", id="r-1", delta="Partial"),
        ]
    return [
        raw("tool-input-start", id="call-1", name="echo"),
        raw("tool-input-delta", id="call-1", delta="Partial"),
    ]


def closed_fragment(events: list[ClientEvent], kind: str) -> list[str]:
    """The full values the durable ``*.ended`` events recorded for ``kind``."""
    ended = {
        "text": "session.text.ended",
        "reasoning": "session.reasoning.ended",
        "tool input": "session.tool.input.ended",
    }[kind]
    return [e.data["text"] for e in events if e.type == ended]


@pytest.mark.parametrize("kind", KINDS)
async def test_92_deltas_are_broadcast_but_projections_hold_only_the_full_value(
    h: Harness, kind: str
) -> None:
    sid = await h.session(streamed(kind), [{"text": "after the tool"}], [{"text": "never"}])
    follower = Follower(h, sid)
    await asyncio.wait_for(follower.synced.wait(), 10)
    await h.client.prompt(sid, "Go")
    live = await follower.done()
    live_deltas = [e.data for e in live if e.data.type == DELTA_TYPES[kind]]
    assert len(live_deltas) == 32
    expected = TOOL_TEXT if kind == "tool input" else VALUE
    assert "".join(d.delta for d in live_deltas) == expected
    events = await h.events(sid)
    assert [e.type for e in events].count(DELTA_TYPES[kind]) == 32
    assert closed_fragment(events, kind) == [expected]
    assistant = (await assistants(h, sid))[0]
    if kind == "tool input":
        tool = assistant.tool("call-1")
        assert tool is not None and tool.state.status == "completed"
        assert tool.state.input == json.loads(TOOL_TEXT)
    else:
        assert (assistant.content[0].type, assistant.content[0].text) == (kind, VALUE)
    await assert_replays(h, sid)


@pytest.mark.parametrize("kind", KINDS)
async def test_95_partial_fragments_are_closed_durably_when_the_stream_fails(
    h: Harness, kind: str
) -> None:
    """Catalogue P8: provider errors mid-stream."""
    sid = await h.session([*partial(kind), PROVIDER_UNAVAILABLE], [{"text": "never"}])
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error == TRANSPORT
    assert len(h.requests()) == 1  # output had started: a transport failure is not retried
    assert closed_fragment(await h.events(sid), kind) == ["Partial"]
    for history in (await h.messages(sid), await replayed(h, sid)):
        (assistant,) = [m for m in history if m.type == "assistant"]
        assert (assistant.finish, assistant.error) == ("error", TRANSPORT)
        if kind == "tool input":
            tool = assistant.tool("call-1")
            assert tool is not None
            assert (tool.state.status, tool.state.input) == ("pending", "Partial")
        else:
            assert [(p.type, p.text) for p in assistant.content] == [(kind, "Partial")]


@pytest.mark.parametrize("kind", KINDS)
async def test_98_partial_fragments_are_closed_durably_when_the_stream_is_interrupted(
    h: Harness, kind: str
) -> None:
    sid = await h.session(
        [*partial(kind), {"wait_for_file": h.gate_file("never")}], [{"text": "never"}]
    )
    await h.client.prompt(sid, "Go")
    await h.until(lambda: len(h.requests()) == 1)
    await asyncio.sleep(0.3)
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 1
    events = await h.events(sid)
    assert events[-1].type == "session.execution.interrupted"
    assert closed_fragment(events, kind) == ["Partial"]
    for history in (await h.messages(sid), await replayed(h, sid)):
        (assistant,) = [m for m in history if m.type == "assistant"]
        assert (assistant.finish, assistant.error) == ("error", INTERRUPTED_STEP)
        if kind == "tool input":
            tool = assistant.tool("call-1")
            assert tool is not None and tool.state.status == "error"
            assert tool.state.error == INTERRUPTED_TOOL
        else:
            assert [(p.type, p.text) for p in assistant.content] == [(kind, "Partial")]


# --- stream validation --------------------------------------------------------------------------


async def test_101_duplicate_streamed_text_starts_are_rejected(h: Harness) -> None:
    """Catalogue P7: out-of-order blocks."""
    sid = await h.session(
        [raw("text-start", id="text-1"), raw("text-start", id="text-1")], [{"text": "never"}]
    )
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error is not None
    assert outcome.error.message == "Duplicate text start: text-1"
    assert len(h.requests()) == 1


async def test_102_streamed_raw_tool_input_becomes_the_parsed_called_input(h: Harness) -> None:
    text = '{"query":"hello"}'
    sid = await h.session(
        [
            raw("tool-input-start", id="ws-1", name="web_search"),
            raw("tool-input-delta", id="ws-1", delta='{"query":'),
            raw("tool-input-delta", id="ws-1", delta='"hello"}'),
            raw("tool-input-end", id="ws-1"),
            raw("tool-call", call_id="ws-1", name="web_search", input=text, provider_executed=True),
            {"finish": {"reason": "stop"}},
        ],
        [{"text": "never"}],
    )
    assert (await resume(h, sid, "Go")).type == "succeeded"
    events = await h.events(sid)
    assert closed_fragment(events, "tool input") == [text]
    assistant = await only_assistant(h, sid)
    tool = assistant.tool("ws-1")
    assert tool is not None and tool.executed
    assert tool.state.status == "error" and tool.state.error == RESULT_MISSING
    assert tool.state.input == {"query": "hello"}
    assert step_events(events, assistant.id) == [
        "session.step.started",
        "session.tool.called",
        "session.tool.failed",
        "session.step.ended",
    ]
    assert len(h.requests()) == 1


async def test_103_malformed_streamed_tool_input_ordering_is_rejected(h: Harness) -> None:
    """Catalogue P1: a result for an id never opened."""
    sid = await h.session([raw("tool-input-delta", id="call-1", delta="{}")], [{"text": "never"}])
    outcome = await resume(h, sid, "Go")
    assert outcome.type == "failed" and outcome.error is not None
    assert outcome.error.message == "Tool input delta before start: call-1"
    assert len(h.requests()) == 1
