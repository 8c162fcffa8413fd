"""Fork (issue 31): a new session from another's history up to a message, in a copy of its
workspace as it was then, on real Temporal and both databases.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from temporalio.testing import WorkflowEnvironment

from sessionflow.models.messages import AssistantMessage, Message, UserMessage
from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, call, harness
from tests.workflows.test_rewind import ALLOW, last_assistant, prompt, texts, tree
from tests.workflows.workers import WorkerProcess


def said(messages: list[Message]) -> list[tuple[str, str]]:
    """Each message's type and what it says (a user's prompt, an assistant's text)."""
    out = []
    for m in messages:
        if isinstance(m, UserMessage):
            out.append(("user", m.text))
        elif isinstance(m, AssistantMessage):
            text = "".join(getattr(p, "text", "") for p in m.content)
            out.append(("assistant", text))
    return out


async def test_a_fork_copies_the_history_and_the_workspace_at_its_message_and_goes_on_alone(
    h: Harness,
) -> None:
    ws = h.workspace
    (ws / "keep.txt").write_text("not the session's\n")
    (ws / ".env").write_text("SECRET=1\n")  # protected: never read, so never copied
    sid = await h.session(
        [
            call("w1", "write", path="a.txt", content="one\n"),
            call("w3", "write", path="c.txt", content="sea\n"),
        ],
        [{"text": "first done"}],
        [call("e1", "edit", path="a.txt", old_string="one", new_string="two")],
        [call("b1", "bash", command="mkdir -p d && echo bee > d/b.txt && rm c.txt")],
        [{"text": "second done"}],
        # The fork's turns: it goes on from the script's next turn, in its own workspace.
        [
            call("w2", "write", path="f.txt", content="fork\n"),
            call("b2", "bash", command="echo more >> a.txt"),
        ],
        [{"text": "fork done"}],
        permissions=ALLOW,
        title="parent",
    )
    await prompt(h, sid, "first")
    at_first = tree(ws)
    mark = await last_assistant(h, sid)
    await prompt(h, sid, "second")
    after = tree(ws)
    assert after != at_first
    copy = h.root / "forked"

    dry = await h.client.fork(sid, mark, workspace=str(copy), dry_run=True)
    assert not dry.applied and not dry.refusals and not copy.exists()
    assert {p.path: p.action for p in dry.paths} == {
        "a.txt": "restore",
        "c.txt": "restore",
        "d/b.txt": "delete",
    }
    plan = await h.client.fork(sid, mark, workspace=str(copy))
    assert plan.applied and plan.fork_session_id, plan
    fid = plan.fork_session_id
    assert tree(ws) == after  # the source is untouched
    assert tree(copy) == {k: v for k, v in at_first.items() if k != ".env"}
    assert ".env" in plan.left_out and not (copy / ".env").exists()

    source, forked = await h.client.messages(sid), await h.client.messages(fid)
    upto = next(i for i, m in enumerate(source) if m.id == mark) + 1
    assert said(forked) == said(source[:upto])
    assert {m.id for m in forked}.isdisjoint(m.id for m in source)
    info = await h.client.store.sessions.get(fid)
    assert info.directory == str(copy) and info.title == "parent (fork #1)"
    assert info.settings["fork"] == {"session_id": sid, "message_id": mark}
    types = await h.types(fid)
    assert (
        types[0] == "session.created" and types[1 : upto + 1] == ["session.message.copied"] * upto
    )
    assert "session.forked" in await h.types(sid)

    (copy / "AGENTS.md").write_text("Fork rules")
    await prompt(h, fid, "in the fork")
    seen = texts(h.requests()[-1])
    # Its context is read from its own workspace, into the system prompt (frozen anew).
    assert any("Fork rules" in part for part in h.requests()[-2]["system"])
    assert "first done" in seen and "second done" not in seen and "in the fork" in seen
    assert (copy / "f.txt").read_text() == "fork\n" and not (ws / "f.txt").exists()
    assert tree(ws) == after

    assert (copy / "a.txt").read_text() == "one\nmore\n"
    # The fork's journal came with it, as the copy holds those files: the shell's change of
    # a.txt (its "before" seen by metadata only) is undone like one in the source.
    copied_last = forked[-1].id
    undone = await h.client.revert(fid, copied_last)
    assert undone.applied, undone
    assert (copy / "a.txt").read_text() == "one\n" and not (copy / "f.txt").exists()
    # And a revert there to before the session wrote anything.
    first_user = next(m.id for m in await h.client.messages(fid) if m.type == "user")
    undone = await h.client.revert(fid, first_user)
    assert undone.applied, undone
    assert not (copy / "a.txt").exists() and not (copy / "c.txt").exists()
    assert (copy / "keep.txt").exists()


async def test_a_fork_is_refused_clearly_and_changes_nothing(h: Harness) -> None:
    ws = h.workspace
    (ws / "pre.txt").write_text("before the session\n")
    held = h.gate_file("held")
    sid = await h.session(
        [call("b1", "bash", command="echo changed > pre.txt")],
        [{"text": "ran"}],
        [{"text": "working "}, {"wait_for_file": held}, {"text": "done"}],
        permissions=ALLOW,
    )
    first = await h.client.prompt(sid, "run")
    await h.client.wait_idle(sid, timeout=60)
    taken = h.root / "taken"
    taken.mkdir()
    cases = {
        str(taken): "already exists",
        str(ws / "inside"): "outside the session's workspace",
        str(h.root / "no" / "parent"): "no parent directory",
    }
    for where, why in cases.items():
        plan = await h.client.fork(sid, first.id, workspace=where)
        assert not plan.applied and plan.refused and why in plan.refused, (where, plan)
    plan = await h.client.fork(sid, "msg_nope", workspace=str(h.root / "f1"))
    assert plan.refused and "no message 'msg_nope'" in plan.refused
    # The shell changed a file the journal never read: its content at the message is unknown.
    plan = await h.client.fork(sid, first.id, workspace=str(h.root / "f2"))
    assert [(p.path, p.refused) for p in plan.refusals] == [("pre.txt", "unknown-before")]
    assert not (h.root / "f2").exists()
    plan = await h.client.fork(sid, first.id, workspace=str(h.root / "f2"), force=["pre.txt"])
    assert plan.applied and (h.root / "f2" / "pre.txt").read_text() == "changed\n"
    assert os.listdir(h.root / "f2") == ["pre.txt"]  # the shell's file left as it is now

    await h.client.prompt(sid, "busy now")
    await h.until(lambda: len(h.requests()) == 3, timeout=30)
    plan = await h.client.fork(sid, first.id, workspace=str(h.root / "f3"))
    assert plan.refused and "busy" in plan.refused and not (h.root / "f3").exists()
    h.open_gate("held")
    await h.client.wait_idle(sid, timeout=60)
    assert [s.id for s in await h.client.list_sessions()].count(plan.fork_session_id) == 0


async def test_a_worker_killed_mid_copy_leaves_no_fork_and_the_retry_makes_it_whole(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """SIGKILL while the copy's paths are put back (a hook between two of them): no fork
    session, no ``session.forked``; the activity's retry on another worker removes the dead
    attempt's copy, copies again and makes the fork once."""
    gate = str(tmp_path / "revert.gate")
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        first = WorkerProcess(
            temporal_env, target, h.client.task_queue, SESSIONFLOW_TEST_REVERT_GATE=gate
        )
        workers.append(first)
        await first.ready()
        sid = await h.session(
            [call(f"w{n}", "write", path=f"{n}.txt", content=f"{n}\n") for n in "abc"],
            [{"text": "written"}],
        )
        (h.workspace / "kept.txt").write_text("before the session\n")
        receipt = await h.client.prompt(sid, "write")
        await h.client.wait_idle(sid, timeout=60)
        copy = tmp_path / "forked"
        forking = asyncio.create_task(h.client.fork(sid, receipt.id, workspace=str(copy)))
        await h.until(lambda: Path(f"{gate}.reached").exists(), timeout=30)
        first.signal(signal.SIGKILL)
        assert not copy.exists() and [s.id for s in await h.client.list_sessions()] == [sid]
        second = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(second)
        await second.ready()
        plan = await asyncio.wait_for(forking, 90)
        assert plan.applied, plan
        assert tree(copy) == {"kept.txt": tree(h.workspace)["kept.txt"]}
        assert sorted(p.name for p in tmp_path.iterdir() if ".fork-" in p.name) == []
        sessions = {s.id for s in await h.client.list_sessions()}
        assert sessions == {sid, plan.fork_session_id}
        assert (await h.types(sid)).count("session.forked") == 1
