"""The file-change journal on the host (``activities/journal.py``) and the revert's per-path
decision (``activities/rewind.py: decide``), on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities import journal
from activities.rewind import Goal, JournalEntry, decide, revert_goals
from activities.tools.base import ToolOutput
from activities.tools.paths import Workspace
from activities.tools.settings import ToolSettings
from sessionflow.models.journal import FileState

SETTINGS = ToolSettings(journal_max_bytes=64)


def output(
    *paths: str, seen: dict[str, tuple[int, int, int, int] | None] | None = None
) -> ToolOutput:
    return ToolOutput(output_paths=paths, seen_before=seen)


def test_a_written_file_is_journaled_with_what_it_held_before_and_after(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old\n")
    before = journal.capture(str(tmp_path), SETTINGS, ["./a.txt", "new.txt"])
    assert set(before) == {"a.txt", "new.txt"}  # canonical paths
    (tmp_path / "a.txt").write_text("new\n")
    (tmp_path / "new.txt").write_text("made\n")
    changes, kept = journal.changes(str(tmp_path), SETTINGS, before, output("a.txt", "new.txt"))
    by_path = {c.path: c for c in changes}
    a = by_path["a.txt"]
    assert a.before is not None and a.after is not None
    assert a.before.stored and a.after.stored and a.before.digest != a.after.digest
    assert by_path["new.txt"].before is None
    assert sorted(kept) == [b"made\n", b"new\n", b"old\n"]


def test_a_file_named_but_left_as_it_was_costs_nothing(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("same\n")
    before = journal.capture(str(tmp_path), SETTINGS, ["a.txt"])
    assert journal.changes(str(tmp_path), SETTINGS, before, output()) == ([], [])


def test_a_file_over_the_cap_is_journaled_by_digest_only(tmp_path: Path) -> None:
    big = b"x" * 65
    (tmp_path / "big.bin").write_bytes(big)
    changes, kept = journal.changes(
        str(tmp_path), SETTINGS, {}, output("big.bin", seen={"big.bin": None})
    )
    (change,) = changes
    assert change.after is not None and change.after.digest and not change.after.stored
    assert kept == []


def test_protected_paths_are_never_journaled(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SECRET=1\n")
    assert journal.capture(str(tmp_path), SETTINGS, [".env"]) == {}
    changes, kept = journal.changes(
        str(tmp_path), SETTINGS, {}, output(".env", seen={".env": None})
    )
    assert changes == [] and kept == []
    with Workspace(str(tmp_path), SETTINGS) as workspace, pytest.raises(journal.Unjournaled):
        journal.restore(workspace, ".env", None, None)
    assert (tmp_path / ".env").exists()


def test_a_link_pointing_outside_is_recorded_and_restored_as_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not the workspace's\n")
    root = tmp_path / "ws"
    root.mkdir()
    os.symlink(outside, root / "l")
    changes, _ = journal.changes(str(root), SETTINGS, {}, output("l", seen={"l": None}))
    (change,) = changes
    assert change.after is not None and change.after.kind == "symlink"
    assert change.after.target == str(outside)
    with Workspace(str(root), SETTINGS) as workspace:
        journal.restore(workspace, "l", None, None)  # deletes the link, never its target
        assert not os.path.lexists(root / "l") and outside.exists()
        journal.restore(workspace, "l", change.after, None)
    assert os.readlink(root / "l") == str(outside)
    assert outside.read_text() == "not the workspace's\n"


def test_a_restore_makes_missing_directories_and_is_idempotent(tmp_path: Path) -> None:
    state = FileState(digest="sha256:x", size=3, mode=0o100750, stored=True)
    with Workspace(str(tmp_path), SETTINGS) as workspace:
        for _ in range(2):
            journal.restore(workspace, "d/e/f.txt", state, b"abc")
    path = tmp_path / "d" / "e" / "f.txt"
    assert path.read_bytes() == b"abc" and path.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in (tmp_path / "d" / "e").iterdir()] == ["f.txt"]  # no temporary left


def _file(digest: str, **meta: int) -> FileState:
    return FileState(digest=digest, stored=True, **meta)


def test_the_decision_refuses_what_changed_since_unless_forced() -> None:
    goal = Goal("a.txt", to=_file("sha256:old"), expected=_file("sha256:new"))
    ok = decide(goal, _file("sha256:new"), kept=True, forced=False)
    assert (ok.action, ok.refused) == ("restore", None)
    edited = decide(goal, _file("sha256:person"), kept=True, forced=False)
    assert (edited.action, edited.refused) == ("restore", "changed-since")
    forced = decide(goal, _file("sha256:person"), kept=True, forced=True)
    assert (forced.action, forced.refused, forced.forced) == ("restore", None, True)
    done = decide(goal, _file("sha256:old"), kept=True, forced=False)
    assert done.action == "unchanged" and done.refused is None  # a retry finds it restored
    lost = decide(goal, _file("sha256:new"), kept=False, forced=False)
    assert lost.refused == "content-not-kept"


def test_the_shells_before_is_found_in_an_earlier_after_with_the_same_metadata() -> None:
    written = _file("sha256:one", size=4, mtime_ns=10, inode=7, mode=0o100644)
    seen = FileState(size=4, mtime_ns=10, inode=7, mode=0o100644)  # the shell's snapshot
    entries = [
        JournalEntry(0, "a.txt", None, written, "msg_1"),
        JournalEntry(1, "a.txt", seen, _file("sha256:two"), "msg_2"),
    ]
    (goal,) = revert_goals(entries, {"msg_2"})
    assert goal.to == written and not goal.unknown
    touched = FileState(size=4, mtime_ns=11, inode=7, mode=0o100644)  # rewritten unseen
    entries[1] = JournalEntry(1, "a.txt", touched, _file("sha256:two"), "msg_2")
    (goal,) = revert_goals(entries, {"msg_2"})
    assert goal.unknown
    unknown = decide(goal, _file("sha256:two"), kept=True, forced=False)
    assert unknown.refused == "unknown-before"
    left = decide(goal, _file("sha256:two"), kept=True, forced=True)
    assert left.action == "unchanged" and left.forced and left.to == left.now


def test_a_call_keeps_content_only_up_to_its_budget(tmp_path: Path) -> None:
    settings = ToolSettings(journal_max_bytes=64, journal_call_bytes=100)
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(name.encode() * 40)
    seen: dict[str, tuple[int, int, int, int] | None] = {"a": None, "b": None, "c": None}
    changes, kept = journal.changes(str(tmp_path), settings, {}, output("a", "b", "c", seen=seen))
    assert [c.after.stored for c in changes if c.after] == [True, True, False]
    assert sum(map(len, kept)) == 80 and all(c.after and c.after.digest for c in changes)
