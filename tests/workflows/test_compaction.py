"""Compaction (reference §4.9, runner cases #23-30): the barrier, auto compaction, overflow.

Every case asserts the requests the scripted provider logged, as the reference's tests do.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.providers.errors import classify
from sessionflow.models.messages import CompactionMessage
from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, harness
from tests.workflows.workers import WorkerProcess

SMALL = {"keep_tokens": 20, "buffer": 0}


def _limited(h: Harness, turns: list[list[dict[str, Any]]], context: int, output: int) -> str:
    path = h.root / "model.json"
    script = {"limits": {"context": context, "output": output}, "turns": []}
    script["turns"] = [{"events": events} for events in turns]
    path.write_text(json.dumps(script))
    return f"scripted/{path}"


def _user_texts(request: dict[str, Any]) -> list[str]:
    return [
        part["text"]
        for message in request["messages"]
        if message["role"] == "user"
        for part in message["content"]
        if part["type"] == "text"
    ]


async def _assistants(h: Harness, sid: str) -> list[Any]:
    return [m for m in await h.messages(sid) if m.type == "assistant"]


async def _compactions(h: Harness, sid: str) -> list[CompactionMessage]:
    return [m for m in await h.messages(sid) if isinstance(m, CompactionMessage)]


async def test_23_a_manual_compaction_is_a_barrier_before_later_steer_and_queued_prompts(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"text": "working on it"}, {"wait_for_file": h.gate_file("turn")}],
        [{"text": "durable summary"}],
        [{"text": "steered"}],
        [{"text": "queued"}],
        compaction=SMALL,
    )
    await h.client.prompt(sid, "One")
    await h.until(lambda: len(h.requests()) == 1)
    first = await h.client.compact(sid)
    assert await h.client.compact(sid) == first  # one pending compaction at a time
    assert [m.status for m in await _compactions(h, sid)] == ["queued"]
    await h.client.prompt(sid, "Two")
    await h.client.prompt(sid, "Three", delivery="queue")
    assert not await h.store.inputs.has_pending(sid, "steer")  # behind the barrier
    h.open_gate("turn")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 4
    assert requests[1]["tools"] == [] and requests[1]["messages"][0]["role"] == "user"
    assert _user_texts(requests[1])[0].startswith("Create a new anchored summary")
    checkpoint, *rest = _user_texts(requests[2])
    assert "<summary>\ndurable summary\n</summary>" in checkpoint
    assert "[Assistant]: working on it" in checkpoint  # kept verbatim as recent context
    assert rest == ["Two"]
    assert _user_texts(requests[3])[-1] == "Three"
    (compaction,) = await _compactions(h, sid)
    assert (compaction.status, compaction.summary, compaction.id) == (
        "completed",
        "durable summary",
        first,
    )


async def test_24_a_failed_summary_releases_the_barrier_and_queued_prompts_run(
    h: Harness,
) -> None:
    sid = await h.session(
        [{"text": "first answer"}],
        [{"finish": {"reason": "stop"}}],  # the summary call returns no text
        [{"text": "queued answer"}],
        compaction=SMALL,
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.compact(sid)
    await h.client.prompt(sid, "Later", delivery="queue")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 3
    assert _user_texts(h.requests()[2]) == ["One", "Later"]
    assert [m.status for m in await _compactions(h, sid)] == ["failed"]
    assert await h.store.inputs.pending_compaction(sid) is None


async def test_nothing_to_summarize_is_not_compacted_and_the_drain_goes_on(h: Harness) -> None:
    sid = await h.session([{"text": "answered"}], compaction=SMALL)
    await h.client.compact(sid)  # the history is empty
    await h.client.prompt(sid, "One", delivery="queue")
    await h.client.wait_idle(sid, timeout=30)
    assert [_user_texts(r) for r in h.requests()] == [["One"]]
    (compaction,) = await _compactions(h, sid)
    assert compaction.status == "failed"


async def test_25_auto_compaction_summarizes_before_a_request_that_would_not_fit(
    h: Harness,
) -> None:
    # 1600 tokens: with the tool definitions (about 1500) the next request would not fit in
    # 4000 - 1000.
    big = "x" * 6400
    model = _limited(
        h,
        [
            [{"text": big}],
            [{"text": "## Objective\n- Preserve the task"}],
            [{"text": "after the summary"}],
            [{"text": big}],
            [{"text": "second summary"}],
            [{"text": "done"}],
        ],
        context=4000,
        output=1000,
    )
    sid = await h.client.create_session(workspace=str(h.workspace), model=model, compaction=SMALL)
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "recent request")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 3
    assert _user_texts(requests[1])[0].startswith("Create a new anchored summary")
    checkpoint, prompt = _user_texts(requests[2])
    assert "<summary>\n## Objective\n- Preserve the task\n</summary>" in checkpoint
    assert prompt == "recent request"
    assert [m["role"] for m in requests[2]["messages"]] == ["user", "user"]
    # A second cycle updates the first summary.
    await h.client.prompt(sid, "more")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "again")
    await h.client.wait_idle(sid, timeout=30)
    update = _user_texts(h.requests()[4])[0]
    assert "<previous-summary>\n## Objective\n- Preserve the task\n</previous-summary>" in update
    assert [c.reason for c in await _compactions(h, sid)] == ["auto", "auto"]
    assert (await h.types(sid))[-1] == "session.execution.succeeded"


async def test_26_a_context_overflow_is_compacted_once_and_the_step_retried(h: Harness) -> None:
    sid = await h.session(
        [{"text": "a long answer"}],
        [{"provider_error": "prompt is too long: 250000 tokens > 200000 maximum"}],
        [{"text": "the summary"}],
        [{"text": "fits now"}],
        [{"text": "next answer"}],
        compaction=SMALL,
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "Continue")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 4
    assert _user_texts(requests[2])[0].startswith("Create a new anchored summary")
    (checkpoint,) = _user_texts(requests[3])  # the prompt is recent context now
    assert "<summary>\nthe summary\n</summary>" in checkpoint and "[User]: Continue" in checkpoint
    last = (await _assistants(h, sid))[-1]
    assert last.finish == "stop" and last.error is None
    # The retried step keeps its message, listed before the compaction (DESIGN.md)...
    assert [m.type for m in await h.messages(sid)][-1] == "compaction"
    assert (await h.types(sid))[-1] == "session.execution.succeeded"
    # ... and the context is the reference's: the checkpoint, then the recovered answer.
    await h.client.prompt(sid, "Next")
    await h.client.wait_idle(sid, timeout=30)
    after = h.requests()[4]
    assert h.roles(after) == ["user", "assistant", "user"]
    assert after["messages"][1]["content"][0]["text"] == "fits now"
    assert _user_texts(after)[-1] == "Next"


async def test_27_a_second_overflow_after_one_recovery_fails_the_drain(h: Harness) -> None:
    overflow = [{"provider_error": "prompt is too long"}]
    sid = await h.session(
        [{"text": "a long answer"}], overflow, [{"text": "the summary"}], overflow
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "Continue")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 4
    last = (await _assistants(h, sid))[-1]
    assert last.finish == "error"
    assert "prompt is too long" in last.error.message
    assert (await h.types(sid))[-1] == "session.execution.failed"


async def test_28_a_raw_context_overflow_failure_is_compacted_once_and_retried(
    h: Harness,
) -> None:
    # Not an event: the adapter raises, having classified the HTTP 400 as an overflow.
    message = "This model's maximum context length is 128000 tokens."
    assert classify(400, "invalid_request_error", "context_length_exceeded", message) == (
        "context_overflow"
    )
    overflow = {"kind": "context_overflow", "message": message, "status": 400}
    sid = await h.session(
        [{"text": "a long answer"}],
        [{"error": overflow}],
        [{"text": "the summary"}],
        [{"text": "fits now"}],
        compaction=SMALL,
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "Continue")
    await h.client.wait_idle(sid, timeout=30)
    requests = h.requests()
    assert len(requests) == 4
    assert _user_texts(requests[2])[0].startswith("Create a new anchored summary")
    (checkpoint,) = _user_texts(requests[3])
    assert "<summary>\nthe summary\n</summary>" in checkpoint and "[User]: Continue" in checkpoint
    last = (await _assistants(h, sid))[-1]
    assert last.finish == "stop" and last.error is None
    (compaction,) = await _compactions(h, sid)
    assert (compaction.status, compaction.summary) == ("completed", "the summary")
    assert (await h.types(sid))[-1] == "session.execution.succeeded"


async def test_29_the_original_overflow_stands_when_the_summary_fails(h: Harness) -> None:
    sid = await h.session(
        [{"text": "a long answer"}],
        [{"provider_error": "prompt is too long"}],
        [{"finish": {"reason": "stop"}}],
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "Continue")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 3
    assert await _compactions(h, sid) == []
    *_, user, assistant = await h.messages(sid)
    assert user.type == "user" and user.text == "Continue"
    assert assistant.finish == "error" and "prompt is too long" in assistant.error.message


async def test_30_an_interrupt_during_the_summary_writes_no_compaction(h: Harness) -> None:
    sid = await h.session(
        [{"text": "a long answer"}],
        [{"provider_error": "prompt is too long"}],
        [{"text": "partial summ"}, {"wait_for_file": h.gate_file("never")}],
    )
    await h.client.prompt(sid, "One")
    await h.client.wait_idle(sid, timeout=30)
    await h.client.prompt(sid, "Continue")
    await h.until(lambda: len(h.requests()) == 3)
    assert (await h.client.interrupt(sid)).status == "stopped"
    await h.client.wait_idle(sid, timeout=30)
    assert await _compactions(h, sid) == []
    assert (await h.types(sid))[-1] == "session.execution.interrupted"


async def test_a_compaction_of_an_unknown_session_is_a_clear_error(h: Harness) -> None:
    from sessionflow.errors import SessionNotFoundError

    try:
        await h.client.compact("ses_missing")
    except SessionNotFoundError as error:
        assert "ses_missing" in str(error)
    else:
        raise AssertionError("compact accepted an unknown session")


def test_limits_that_make_no_sense_are_refused(tmp_path: Path) -> None:
    from activities.providers.scripted import ScriptError, load_script

    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"limits": {"context": 100, "output": 200}, "turns": []}))
    try:
        load_script(path)
    except ScriptError as error:
        assert "must be smaller than the context window" in str(error)
    else:
        raise AssertionError("a script whose output limit exceeds its window loaded")


async def test_a_worker_killed_during_the_summary_leaves_exactly_one_compaction(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    # The summary streams a little, then waits for a file nobody creates: the kill lands
    # mid-summary however long the second worker takes to start.
    slow = [
        {"text": "".join(f"{i:03d} " for i in range(10)), "chunks": 10, "delay_ms": 10},
        {"wait_for_file": str(tmp_path / "never")},
    ]
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        first = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(first)
        await first.ready()
        sid = await h.session(
            [{"text": "first answer"}],
            slow,
            [{"text": "final summary"}],
            [{"text": "queued answer"}],
            compaction=SMALL,
        )
        await h.client.prompt(sid, "One")
        await h.client.wait_idle(sid, timeout=30)
        await h.client.compact(sid)
        await h.client.prompt(sid, "Later", delivery="queue")
        await h.until(lambda: _summary_streaming(h, sid), timeout=30)
        second = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(second)
        await second.ready()
        first.signal(signal.SIGKILL)
        await h.until(lambda: len(h.requests()) == 4, timeout=90)
        await h.client.wait_idle(sid, timeout=60)
        (compaction,) = await _compactions(h, sid)
        types = await h.types(sid)
    assert (compaction.status, compaction.summary) == ("completed", "final summary")
    assert types.count("session.compaction.ended") == 1
    assert types[-1] == "session.execution.succeeded"
    assert _user_texts(h.requests()[3])[-1] == "Later"


async def _summary_streaming(h: Harness, sid: str) -> bool:
    return (await h.types(sid, deltas=True)).count("session.compaction.delta") >= 3


async def test_a_long_session_with_a_small_window_compacts_again_and_again(h: Harness) -> None:
    from tests.workflows.harness import call
    from tests.workflows.test_history import MAX_PAYLOAD_BYTES, _payload_sizes

    steps = 200
    turns = [
        [{"text": f"note {i} " + "y" * 200}, call(f"c{i}", text="z" * 200)] for i in range(steps)
    ]
    turns += [[{"text": "done"}]] * 60
    model = _limited(h, turns, context=3000, output=400)
    sid = await h.client.create_session(
        workspace=str(h.workspace), model=model, compaction={"keep_tokens": 300, "buffer": 0}
    )
    await h.client.prompt(sid, "Work through it")
    await h.client.wait_idle(sid, timeout=240)
    types = await h.types(sid)
    assert types[-1] == "session.execution.succeeded"
    compactions = await _compactions(h, sid)
    assert len(compactions) >= 5 and all(c.status == "completed" for c in compactions)
    # Every request stayed near the window (3000 tokens, ~12,000 characters of text; the JSON's
    # keys and ids add some): without compaction the last one would be over 200,000.
    assert max(len(json.dumps(r)) for r in h.requests()) < 15_000
    history = await h.client._handle(sid).fetch_history()
    from google.protobuf.json_format import MessageToDict

    sizes = [size for event in history.events for size in _payload_sizes(MessageToDict(event))]
    assert max(sizes) < MAX_PAYLOAD_BYTES
