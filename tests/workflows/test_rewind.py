"""Rewind (issue 31): the file-change journal, revert and unrevert, on real Temporal.

A session writes, edits and runs shell commands that create, modify and delete files over
three prompts; each revert must leave the workspace exactly as it was at its message (the
digest of every file), touch nothing else, and hide the later messages from history and from
the next request.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from sessionflow.models.messages import AssistantMessage
from store import Store
from tests.conftest import Target
from tests.workflows.harness import Harness, call, harness
from tests.workflows.workers import WorkerProcess

ALLOW = [{"tool": "bash", "action": "allow"}]


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and link under ``root``: its content digest (a link: its target), mode."""
    found: dict[str, tuple[str, int]] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(directory, d)))]:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if os.path.islink(path):
                found[rel] = ("link:" + os.readlink(path), 0)
            else:
                found[rel] = (
                    hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                    st.st_mode & 0o777,
                )
    return found


async def last_assistant(h: Harness, sid: str) -> str:
    messages = await h.client.messages(sid)
    return next(m.id for m in reversed(messages) if isinstance(m, AssistantMessage))


async def prompt(h: Harness, sid: str, text: str) -> None:
    await h.client.prompt(sid, text)
    await h.client.wait_idle(sid, timeout=60)


def texts(request: dict[str, Any]) -> list[str]:
    out = []
    for message in request["messages"]:
        for part in message["content"]:
            if part.get("type") == "text":
                out.append(part["text"])
    return out


async def test_a_revert_puts_the_workspace_back_at_each_message_and_hides_what_came_after(
    h: Harness,
) -> None:
    ws = h.workspace
    (ws / "keep.txt").write_text("not the session's\n")
    keep_mtime = (ws / "keep.txt").stat().st_mtime_ns
    sid = await h.session(
        [call("w1", "write", path="a.txt", content="one\n")],
        [{"text": "first done"}],
        [call("e1", "edit", path="a.txt", old_string="one", new_string="two")],
        [call("b1", "bash", command="mkdir -p d && echo bee > d/b.txt && chmod 755 a.txt")],
        [{"text": "second done"}],
        [call("b2", "bash", command="rm d/b.txt && echo sea > c.txt && ln -s a.txt l")],
        [{"text": "third done"}],
        [{"text": "after the revert"}],
        permissions=ALLOW,
    )
    states = [tree(ws)]
    marks = []
    for text in ("first", "second", "third"):
        await prompt(h, sid, text)
        states.append(tree(ws))
        marks.append(await last_assistant(h, sid))
    assert states[1] != states[2] != states[3]
    first_user = next(m.id for m in await h.client.messages(sid) if m.type == "user")

    plan = await h.client.revert(sid, marks[1])  # to the end of the second prompt
    assert plan.applied and not plan.refusals, plan
    assert tree(ws) == states[2]
    shown = [m.id for m in await h.client.messages(sid)]
    assert shown[-1] == marks[1]  # the third prompt and its answer are hidden
    everything = [m.id for m in await h.client.messages(sid, hidden=True)]
    assert marks[2] in everything  # kept, marked hidden

    plan = await h.client.revert(sid, marks[0])  # further back, on top of the first revert
    assert plan.applied, plan
    assert tree(ws) == states[1]
    plan = await h.client.revert(sid, first_user)  # before the session changed anything
    assert plan.applied, plan
    assert tree(ws) == states[0]
    assert (ws / "keep.txt").stat().st_mtime_ns == keep_mtime  # untouched

    plan = await h.client.unrevert(sid)  # undoes the last revert only
    assert plan.applied, plan
    assert tree(ws) == states[1]
    assert [m.id for m in await h.client.messages(sid)][-1] == marks[0]

    await prompt(h, sid, "fourth")  # makes the revert permanent
    request = h.requests()[-1]
    seen = texts(request)
    assert "first done" in seen and "second done" not in seen and "third done" not in seen
    everything = [m.id for m in await h.client.messages(sid, hidden=True)]
    assert marks[1] not in everything and marks[2] not in everything  # dropped for good
    again = await h.client.unrevert(sid)
    assert not again.applied and again.refused and "nothing to unrevert" in again.refused
    types = await h.types(sid)
    assert types.count("session.reverted") == 3 and "session.revert.committed" in types


async def test_a_file_edited_since_refuses_the_revert_unless_forced(h: Harness) -> None:
    ws = h.workspace
    sid = await h.session(
        [
            call("w1", "write", path="a.txt", content="one\n"),
            call("w2", "write", path="b.txt", content="b\n"),
        ],
        [{"text": "written"}],
        permissions=ALLOW,
    )
    first = await h.client.prompt(sid, "write")
    await h.client.wait_idle(sid, timeout=60)
    (ws / "a.txt").write_text("a person's edit\n")
    plan = await h.client.revert(sid, first.id)
    assert not plan.applied
    assert [(p.path, p.refused) for p in plan.refusals] == [("a.txt", "changed-since")]
    assert (ws / "a.txt").read_text() == "a person's edit\n" and (ws / "b.txt").exists()
    dry = await h.client.revert(sid, first.id, dry_run=True, force=["a.txt"])
    assert not dry.applied and not dry.refusals
    assert {p.path: p.action for p in dry.paths} == {"a.txt": "delete", "b.txt": "delete"}
    assert (ws / "b.txt").exists()  # a dry run changes nothing
    plan = await h.client.revert(sid, first.id, force=["a.txt"])
    assert plan.applied and not (ws / "a.txt").exists() and not (ws / "b.txt").exists()
    undone = await h.client.unrevert(sid)
    assert undone.applied
    assert (ws / "a.txt").read_text() == "a person's edit\n"  # what the force replaced
    assert (ws / "b.txt").read_text() == "b\n"


async def test_a_file_the_shell_changed_unseen_is_named_and_can_be_left_as_it_is(
    h: Harness,
) -> None:
    ws = h.workspace
    (ws / "pre.txt").write_text("before the session\n")
    sid = await h.session(
        [call("b1", "bash", command="echo changed > pre.txt && echo new > n.txt")],
        [{"text": "ran"}],
        permissions=ALLOW,
    )
    first = await h.client.prompt(sid, "run")
    await h.client.wait_idle(sid, timeout=60)
    plan = await h.client.revert(sid, first.id)
    assert [(p.path, p.refused) for p in plan.refusals] == [("pre.txt", "unknown-before")]
    assert "shell" in (plan.refusals[0].reason or "")
    assert (ws / "n.txt").exists()  # refused whole: nothing changed
    plan = await h.client.revert(sid, first.id, force=["pre.txt"])
    assert plan.applied and not (ws / "n.txt").exists()
    assert (ws / "pre.txt").read_text() == "changed\n"  # left as it is


async def test_a_revert_while_busy_is_refused(h: Harness) -> None:
    held = h.gate_file("held")
    sid = await h.session(
        [call("w1", "write", path="a.txt", content="one\n")],
        [{"text": "working "}, {"wait_for_file": held}, {"text": "done"}],
    )
    first = await h.client.prompt(sid, "write")
    await h.until(lambda: len(h.requests()) == 2, timeout=30)
    plan = await h.client.revert(sid, first.id)
    assert not plan.applied and plan.refused and "busy" in plan.refused
    assert (h.workspace / "a.txt").exists()
    h.open_gate("held")
    await h.client.wait_idle(sid, timeout=60)


async def test_bad_targets_are_refused_clearly(h: Harness) -> None:
    sid = await h.session([{"text": "hi"}])
    first = await h.client.prompt(sid, "hello")
    await h.client.wait_idle(sid, timeout=60)
    plan = await h.client.revert(sid, "msg_nope")
    assert plan.refused and "no message 'msg_nope'" in plan.refused
    last = await last_assistant(h, sid)
    plan = await h.client.revert(sid, last)
    assert plan.refused and "nothing comes after" in plan.refused
    plan = await h.client.unrevert(sid)
    assert plan.refused and "nothing to unrevert" in plan.refused
    assert first.id


async def test_a_worker_killed_between_two_paths_leaves_a_revert_its_retry_finishes(
    temporal_env: WorkflowEnvironment,
    store: Store,
    target: Target,
    tmp_path: Path,
    workers: list[WorkerProcess],
) -> None:
    """SIGKILL after the first of three paths was restored: each path holds its old or its
    new content, the activity's retry on another worker restores the rest, and the event is
    written once."""
    gate = str(tmp_path / "revert.gate")
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        first = WorkerProcess(
            temporal_env, target, h.client.task_queue, SESSIONFLOW_TEST_REVERT_GATE=gate
        )
        workers.append(first)
        await first.ready()
        sid = await h.session(
            [
                call("w1", "write", path="a.txt", content="a\n"),
                call("w2", "write", path="b.txt", content="b\n"),
                call("w3", "write", path="c.txt", content="c\n"),
            ],
            [{"text": "written"}],
        )
        (h.workspace / "b.txt").write_text("b before\n")
        before = tree(h.workspace)
        receipt = await h.client.prompt(sid, "write")
        await h.client.wait_idle(sid, timeout=60)
        reverting = asyncio.create_task(h.client.revert(sid, receipt.id))
        await h.until(lambda: Path(f"{gate}.reached").exists(), timeout=30)
        first.signal(signal.SIGKILL)
        ws = h.workspace  # the paths go in order: a.txt is deleted, b and c not yet restored
        assert not (ws / "a.txt").exists() and (ws / "b.txt").read_text() == "b\n"
        assert (ws / "c.txt").exists()
        second = WorkerProcess(temporal_env, target, h.client.task_queue)
        workers.append(second)
        await second.ready()
        plan = await asyncio.wait_for(reverting, 90)
        assert plan.applied, plan
        assert tree(h.workspace) == before
        types = await h.types(sid)
        assert types.count("session.reverted") == 1
        assert types[-1] == "session.execution.succeeded"
