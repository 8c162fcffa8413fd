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
    to = tmp_path / ".ws.fork-x"
    to.mkdir()
    (to / "stale").write_text("an earlier attempt's\n")

    left_out = fork.copy_workspace(str(source), str(to), SETTINGS)

    assert left_out == [".env", ".git", "pipe"]
    assert sorted(os.listdir(to)) == ["out", "src"]
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
    }
    for where, why in refused.items():
        assert why in (fork.where_refused(str(source), where) or ""), where
    (tmp_path / "taken").mkdir()
    assert "already exists" in (fork.where_refused(str(source), str(tmp_path / "taken")) or "")
    assert fork.where_refused(str(source), str(tmp_path / "new")) is None
    assert fork.staging(str(tmp_path / "new"), "ses_1") == str(tmp_path / ".new.fork-ses_1")


def _source() -> SessionInfo:
    return SessionInfo(
        id="ses_src",
        directory="/ws",
        title="parent (fork #2)",
        model=ModelRef.parse("scripted/x.json"),
        agent=None,
        workspace_id=None,
        parent_id=None,
        settings={"revert": {"boundary_seq": 9}, "baseline": {"b": 1}, "always": ["r"]},
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
    log = fork.fork_log(_source(), "ses_new", "/copy", "t", history, journal, None)
    created, *copies, entry = log.events
    assert isinstance(created, ev.SessionCreated) and created.requests == 4
    assert created.settings == {
        "always": ["r"],
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
    untitled = _source()
    object.__setattr__(untitled, "title", "")
    assert fork.fork_title(untitled, 0) == "ses_src (fork #1)"
