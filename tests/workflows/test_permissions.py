"""Permissions: deny, ask and the durable wait for an answer (reference §4.5 g-n, #60-64).

Real Temporal dev server, both databases, the scripted model; the commands run in the real
shell sandbox. Latches: a test waits for the ``session.permission.asked`` the store shows, never
for a length of time.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.errors import RequestNotWaitingError
from sessionflow.models.permissions import PermissionRequest
from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, call, harness
from tests.workflows.workers import WorkerProcess


async def asked(h: Harness, sid: str, count: int = 1) -> list[PermissionRequest]:
    """The requests waiting, once ``count`` of them are."""
    await h.until(lambda: _waiting(h, sid, count), timeout=30)
    return await h.client.waiting(sid)


async def _waiting(h: Harness, sid: str, count: int) -> bool:
    return len(await h.client.waiting(sid)) >= count


def tool_errors(messages: list[Any]) -> list[str]:
    return [
        part.state.error.message
        for m in messages
        if m.type == "assistant"
        for part in m.content
        if getattr(part, "type", "") == "tool" and part.state.status == "error"
    ]


async def run(h: Harness, sid: str) -> None:
    await h.client.prompt(sid, "Go")
    await h.client.wait_idle(sid, timeout=30)


async def test_a_denied_call_is_blocked_and_the_model_continues(h: Harness) -> None:
    # Reference #60.
    sid = await h.session(
        [call("w1", "write", path="notes/a.txt", content="x")],
        [{"text": "ok"}],
        permissions=[{"tool": "write", "pattern": "notes/*", "action": "deny"}],
    )
    await run(h, sid)
    assert len(h.requests()) == 2
    assert "write" in [tool["name"] for tool in h.requests()[0]["tools"]]
    (error,) = tool_errors(await h.messages(sid))
    assert error == "Permission blocked: the build agent's rules deny write notes/a.txt"
    assert not (h.workspace / "notes").exists()
    assert "session.permission.asked" not in await h.types(sid)


async def test_an_ask_waits_then_runs_once_approved(h: Harness) -> None:
    ran = h.workspace / "ran.txt"
    sid = await h.session([call("b1", "bash", command="touch ran.txt")], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    assert request.tool == "bash" and request.patterns == ("touch *",)
    assert request.summary == "touch ran.txt"
    status = await h.client.status(sid)
    assert status.drain is not None and [r.request_id for r in status.drain.waiting] == [
        request.request_id
    ]
    assert not ran.exists() and len(h.requests()) == 1
    description = await h.client._handle(sid).describe()
    assert not description.raw_description.pending_activities  # the wait holds no activity
    result = await h.client.respond(sid, request.request_id, "once", by="alice")
    assert result.status == "answered"
    await h.client.wait_idle(sid, timeout=30)
    assert ran.exists() and len(h.requests()) == 2
    replied = [e for e in await h.events(sid) if e.type == "session.permission.replied"]
    assert [(e.data["decision"], e.data["by"], e.data["rules"]) for e in replied] == [
        ("once", "alice", [])
    ]
    assert await h.client.waiting(sid) == []


async def test_always_adds_a_rule_that_allows_the_next_call(h: Harness) -> None:
    sid = await h.session(
        [call("b1", "bash", command="touch a.txt")],
        [call("b2", "bash", command="touch b.txt")],
        [{"text": "done"}],
    )
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    await h.client.respond(sid, request.request_id, "always")
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "a.txt").exists() and (h.workspace / "b.txt").exists()
    types = await h.types(sid)
    assert types.count("session.permission.asked") == 1
    info = await h.client.session(sid)
    assert info.settings["always"] == [{"tool": "bash", "pattern": "touch *", "action": "allow"}]


async def test_a_rejection_without_a_message_interrupts_the_step(h: Harness) -> None:
    # Reference #61.
    sid = await h.session([call("b1", "bash", command="touch x")], [{"text": "never"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    await h.client.respond(sid, request.request_id, "reject")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 1 and not (h.workspace / "x").exists()
    assert tool_errors(await h.messages(sid)) == ["Tool execution interrupted"]
    events = await h.events(sid)
    assert events[-1].type == "session.execution.interrupted"
    (replied,) = [e for e in events if e.type == "session.permission.replied"]
    assert (replied.data["decision"], replied.data["reason"]) == ("reject", "answered")


async def test_a_rejection_with_a_message_is_a_correction(h: Harness) -> None:
    # Reference #62.
    sid = await h.session([call("b1", "bash", command="touch x")], [{"text": "ok"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    await h.client.respond(sid, request.request_id, "reject", "Use another tool")
    await h.client.wait_idle(sid, timeout=30)
    assert len(h.requests()) == 2
    assert tool_errors(await h.messages(sid)) == ["Use another tool"]
    assert (await h.events(sid))[-1].type == "session.execution.succeeded"


async def test_a_tool_refusing_on_permission_grounds_stops_the_drain_as_the_users_interrupt(
    h: Harness,
) -> None:
    # Reference §7.2 #64: permission.rejected on the tool and the step, no step.ended, no
    # continuation; §7.4 #2: the busy period settles interrupted, reason user (not failed).
    sid = await h.session([call("r1", "refuse", text="edit")], [{"text": "never"}])
    await run(h, sid)
    assert len(h.requests()) == 1
    events = await h.events(sid)
    types = [e.type for e in events]
    assert "session.step.ended" not in types and "session.execution.failed" not in types
    assert (events[-1].type, events[-1].data["reason"]) == ("session.execution.interrupted", "user")
    tool = next(m for m in await h.messages(sid) if m.type == "assistant").tool("r1")
    assert tool is not None and tool.state.error.type == "permission.rejected"
    assistant = next(m for m in await h.messages(sid) if m.type == "assistant")
    assert assistant.error.type == "permission.rejected"
    assert assistant.error.message == "Permission denied: edit"


@pytest.mark.parametrize(
    ("command", "action"),
    [("ls && rm -rf notes", "deny"), ("ls | grep a; touch notes", "ask")],
)
async def test_a_compound_command_with_one_bad_part(h: Harness, command: str, action: str) -> None:
    (h.workspace / "notes").mkdir()
    sid = await h.session(
        [call("b1", "bash", command=command)],
        [{"text": "ok"}],
        permissions=[{"tool": "bash", "pattern": "rm *", "action": "deny"}],
    )
    await h.client.prompt(sid, "Go")
    if action == "ask":
        (request,) = await asked(h, sid)
        assert request.patterns == ("touch *",)
        await h.client.respond(sid, request.request_id, "reject", "no")
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "notes").is_dir()
    (error,) = tool_errors(await h.messages(sid))
    assert error.startswith("Permission blocked") if action == "deny" else error == "no"


async def test_two_asks_answered_in_the_other_order_while_a_third_call_runs(
    h: Harness,
) -> None:
    sid = await h.session(
        [
            call("b1", "bash", command="touch one"),
            call("b2", "bash", command="touch two"),
            call("e1", "echo", text="meanwhile"),
        ],
        [{"text": "done"}],
        max_active_tools=1,  # the asks hold no slot: the echo runs while both wait
    )
    await h.client.prompt(sid, "Go")
    first, second = await asked(h, sid, 2)
    await h.until(lambda: _succeeded(h, sid, "e1"), timeout=30)
    await h.client.respond(sid, second.request_id, "once")
    await h.until(lambda: (h.workspace / second.summary.split()[-1]).exists(), timeout=30)
    assert not (h.workspace / first.summary.split()[-1]).exists()
    await h.client.respond(sid, first.request_id, "once")
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "one").exists() and (h.workspace / "two").exists()
    assert len(h.requests()) == 2


async def _workflow_waits(h: Harness, sid: str) -> bool:
    status = await h.client.status(sid)
    return status.drain is not None and bool(status.drain.waiting)


async def _succeeded(h: Harness, sid: str, call_id: str) -> bool:
    return any(
        e.type == "session.tool.success" and e.data["call_id"] == call_id
        for e in await h.events(sid)
    )


async def test_an_interrupt_while_waiting_settles_the_ask(h: Harness) -> None:
    sid = await h.session([call("b1", "bash", command="touch x")], [{"text": "never"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    assert await h.client.interrupt(sid)
    await h.client.wait_idle(sid, timeout=30)
    events = await h.events(sid)
    (replied,) = [e for e in events if e.type == "session.permission.replied"]
    assert (replied.data["decision"], replied.data["reason"]) == ("reject", "interrupted")
    assert events[-1].type == "session.execution.interrupted"
    with pytest.raises(RequestNotWaitingError):
        await h.client.respond(sid, request.request_id, "once")
    assert not (h.workspace / "x").exists()


async def test_an_answer_twice_and_an_unknown_request(h: Harness) -> None:
    sid = await h.session([call("b1", "bash", command="echo x >> log")], [{"text": "done"}])
    await h.client.prompt(sid, "Go")
    (request,) = await asked(h, sid)
    with pytest.raises(RequestNotWaitingError, match=request.request_id):
        await h.client.respond(sid, "per_unknown", "once")
    assert (await h.client.respond(sid, request.request_id, "once")).status == "answered"
    assert (await h.client.respond(sid, request.request_id, "once")).status == "answered"
    await h.client.wait_idle(sid, timeout=30)
    assert (h.workspace / "log").read_text() == "x\n"
    types = await h.types(sid)
    assert types.count("session.permission.replied") == 1


async def test_an_unanswered_ask_times_out_as_a_rejection(h: Harness) -> None:
    sid = await h.session(
        [call("b1", "bash", command="touch x")], [{"text": "ok"}], approval_timeout=0.5
    )
    await run(h, sid)
    (error,) = tool_errors(await h.messages(sid))
    assert error.startswith("No answer within 0.5 s")
    (replied,) = [e for e in await h.events(sid) if e.type == "session.permission.replied"]
    assert replied.data["reason"] == "timeout"


async def test_every_worker_killed_while_waiting_then_answered_runs_once(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Any,
    workers: list[WorkerProcess],
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        first = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(first)
        await first.ready()
        sid = await h.session([call("b1", "bash", command="echo ran >> log")], [{"text": "ok"}])
        await h.client.prompt(sid, "Go")
        (request,) = await asked(h, sid)
        await h.until(lambda: _workflow_waits(h, sid), timeout=30)
        first.stop()  # SIGKILL: no worker runs now
        # Answered while no worker runs: sent as a signal, taken when one starts.
        reply = await h.client.respond(sid, request.request_id, "once", wait=2)
        assert reply.status == "sent"
        second = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(second)
        await second.ready()
        await h.client.wait_idle(sid, timeout=60)
        assert (h.workspace / "log").read_text() == "ran\n"
        types = await h.types(sid)
        assert types.count("session.execution.started") == 1
        assert types[-1] == "session.execution.succeeded"
