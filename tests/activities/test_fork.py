"""A fork's copy of the workspace and its log (``activities/fork.py``), on real files."""

from __future__ import annotations

import os
from pathlib import Path

from activities import fork
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, Tokens
from sessionflow.models.journal import FileChange, FileState
from sessionflow.models.messages import AssistantMessage, CompactionMessage, TextPart, UserMessage
from store import Store
from store.sessions import SessionInfo

SETTINGS = ToolSettings()


def test_the_copy_keeps_modes_times_and_links_and_leaves_protected_and_special_files_out(
    tmp_path: Path,
) -> None:
    source, outside = tmp_path / "ws", tmp_path / "outside.txt"
    (source / "src").mkdir(parents=True)
    (source / "src" / "run.sh").write_text("echo hi\n")
    os.chmod(source / "src" / "run.sh", 0o750)
    os.utime(source / "src" / "run.sh", ns=(1_000_000_000, 1_000_000_000))
    outside.write_text("not the workspace's\n")
    os.symlink(outside, source / "out")  # copied as a link, never followed
    (source / ".git").mkdir()
    (source / ".git" / "config").write_text("[core]\n")
    (source / ".env").write_text("SECRET=1\n")
    os.mkfifo(source / "pipe")  # reading it would block the copy
    to = tmp_path / ".ws.fork-x-2"

    os.symlink(source / "src" / "run.sh", source / "inner")  # absolute, into the workspace
    os.symlink("src/run.sh", source / "relative")

    left_out = fork.copy_workspace(str(source), str(to), SETTINGS, becomes="/final")

    assert left_out == [".env", ".git", "pipe"]
    assert sorted(os.listdir(to)) == ["inner", "out", "relative", "src"]
    assert os.readlink(to / "inner") == "/final/src/run.sh"  # the fork's own file
    assert os.readlink(to / "relative") == "src/run.sh"
    copied = (to / "src" / "run.sh").stat()
    assert copied.st_mode & 0o777 == 0o750 and copied.st_mtime_ns == 1_000_000_000
    assert os.readlink(to / "out") == str(outside)


def test_a_forks_directory_must_be_new_absolute_and_apart_from_the_workspace(
    tmp_path: Path,
) -> None:
    source = tmp_path / "ws"
    (source / "sub").mkdir(parents=True)
    refused = {
        "relative": "absolute path",
        str(source / "sub" / "f"): "outside the session's workspace",
        str(tmp_path): "outside the session's workspace",  # it would contain the workspace
        str(source): "outside the session's workspace",
        str(tmp_path / "missing" / "f"): "no parent directory",
        str(tmp_path / "missing" / ".." / "f"): "without '.' or '..'",
        str(tmp_path / "f") + "/.": "without '.' or '..'",
        str(tmp_path / "f") + "/": "without '.' or '..'",
    }
    for where, why in refused.items():
        assert why in (fork.where_refused(str(source), where) or ""), where
    (tmp_path / "taken").mkdir()
    assert "already exists" in (fork.where_refused(str(source), str(tmp_path / "taken")) or "")
    assert fork.where_refused(str(source), str(tmp_path / "new")) is None
    assert fork.staging(str(tmp_path / "new"), "ses_1", 2) == str(tmp_path / ".new.fork-ses_1-2")
    for attempt in (1, 2):
        Path(fork.staging(str(tmp_path / "new"), "ses_1", attempt)).mkdir()
    fork.clear_stale(str(tmp_path / "new"), "ses_1", 2)  # attempt 1's copy, not its own
    assert sorted(p.name for p in tmp_path.glob(".new.*")) == [".new.fork-ses_1-2"]
    staged = fork.staging(str(tmp_path / "new"), "ses_1", 2)
    fork.put_in_place(staged, str(tmp_path / "new"))
    fork.put_in_place(staged, str(tmp_path / "new"))  # a second run of the transaction
    assert (tmp_path / "new").is_dir() and not Path(staged).exists()


def _source() -> SessionInfo:
    return SessionInfo(
        id="ses_src",
        directory="/ws",
        title="parent (fork #2)",
        model=ModelRef.parse("scripted/x.json"),
        agent=None,
        workspace_id=None,
        parent_id=None,
        settings={
            "revert": {"boundary_seq": 9},
            "baseline": {"b": 1},
            "always": ["r"],
            "task": {"depth": 1},
        },
        cost=0.0,
        tokens=Tokens(),
        time_created=0,
        time_updated=0,
        requests=4,
    )


def test_the_forks_log_renumbers_its_messages_and_maps_their_journal_and_compaction() -> None:
    model = ModelRef.parse("scripted/x.json")
    history = [
        UserMessage(id="msg_u", session_id="ses_src", seq=3, time_created=1, text="hi"),
        AssistantMessage(
            id="msg_a",
            session_id="ses_src",
            seq=5,
            time_created=2,
            agent="build",
            model=model,
            time_completed=3,
            content=[TextPart(text="done", ordinal=0)],
        ),
        CompactionMessage(id="msg_c", session_id="ses_src", seq=8, time_created=4, boundary_seq=6),
    ]
    change = FileChange(path="a.txt", after=FileState(digest="d"))
    journal = [
        ev.FilesChanged(
            session_id="ses_src", assistant_message_id="msg_a", call_id="c1", changes=(change,)
        ),
        ev.FilesChanged(
            session_id="ses_src", assistant_message_id="msg_later", call_id="c2", changes=()
        ),
    ]
    log = fork.fork_log(_source(), "ses_new", "/copy", "t", history, journal)
    created, *copies, entry = log.events
    assert isinstance(created, ev.SessionCreated) and created.requests == 4
    assert created.settings == {  # the baseline is rebuilt; a fork is no one's subagent
        "always": ["r"],
        "baseline": None,
        "fork": {"session_id": "ses_src", "message_id": "msg_c"},
    }
    assert all(isinstance(c, ev.MessageCopied) for c in copies)
    messages = [c.message for c in copies if isinstance(c, ev.MessageCopied)]
    assert [m.seq for m in messages] == [1, 2, 3]
    assert {m.session_id for m in messages} == {"ses_new"}
    assert [m.id for m in messages] == [log.ids["msg_u"], log.ids["msg_a"], log.ids["msg_c"]]
    compaction = messages[2]
    assert isinstance(compaction, CompactionMessage) and compaction.boundary_seq == 2
    assert isinstance(entry, ev.FilesChanged) and entry.session_id == "ses_new"
    assert entry.assistant_message_id == log.ids["msg_a"]  # the later call's entry is not copied
    assert history[0].id == "msg_u" and history[0].seq == 3  # the source's are untouched


def test_a_forks_title_counts_the_sources_forks() -> None:
    assert fork.fork_title(_source(), 2) == "parent (fork #3)"
    assert fork.fork_title(_source(), 0) == "parent (fork #3)"  # a fork of fork #2
    untitled = _source()
    object.__setattr__(untitled, "title", "")
    assert fork.fork_title(untitled, 0) == "ses_src (fork #1)"
    object.__setattr__(untitled, "title", "plain")
    assert fork.fork_title(untitled, 1) == "plain (fork #2)"


async def test_a_message_too_large_for_one_event_is_copied_part_by_part(store: Store) -> None:
    source = await store.sessions.create("/ws", title="big")
    model = ModelRef.parse("scripted/x.json")
    text = [TextPart(text=str(n) * 3000, ordinal=n) for n in range(3)]
    history = [
        UserMessage(id="msg_u", session_id=source.id, seq=1, time_created=1, text="hi"),
        AssistantMessage(
            id="msg_a",
            session_id=source.id,
            seq=2,
            time_created=2,
            agent="build",
            model=model,
            time_completed=3,
            content=text,
            cost=0.5,
        ),
    ]
    log = fork.fork_log(source, "ses_forked", "/copy", "t", history, [], max_bytes=8000)
    assert [e.type for e in log.events] == [
        "session.created",
        "session.message.copied",
        "session.message.copied",
        *["session.part.copied"] * 3,
    ]
    await store.events.publish_many(log.events)
    (user, answer) = await store.sessions.messages("ses_forked")
    assert isinstance(answer, AssistantMessage) and answer.content == text
    assert (user.seq, answer.seq) == (1, 2) and answer.id == log.ids["msg_a"]
    assert (await store.sessions.get("ses_forked")).cost == 0.5  # its step's spend came too
