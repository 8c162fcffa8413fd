"""``apply_patch``: add, update by context hunks, move and delete, all or nothing, inside the
workspace only (escapes audited on an outside directory, as the other file tools are)."""

from __future__ import annotations

import errno
import os
import re

import pytest

from activities.tools.base import ToolFailure
from tests.activities.tools.conftest import Sandbox, text


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


@pytest.fixture
def project(sandbox: Sandbox) -> Sandbox:
    ws = sandbox.workspace
    (ws / "src").mkdir()
    (ws / "src" / "app.py").write_text("def main():\n    print('one')\n    return 1\n")
    (ws / "src" / "util.py").write_text("X = 1\nY = 2\n")
    (ws / "old.txt").write_text("bye\n")
    (ws / "crlf.txt").write_bytes(b"a\r\nb\r\n")
    return sandbox


async def test_a_patch_adds_updates_moves_and_deletes(project: Sandbox) -> None:
    ws = project.workspace
    output = await project.call(
        "apply_patch",
        patch_text=patch(
            "*** Add File: docs/notes.md",
            "+# Notes",
            "+first",
            "*** Update File: src/app.py",
            "@@ def main():",
            "-    print('one')",
            "+    print('two')",
            "     return 1",
            "*** Update File: src/util.py",
            "*** Move to: src/consts.py",
            "@@",
            " X = 1",
            "-Y = 2",
            "+Y = 3",
            "*** Delete File: old.txt",
            "*** Update File: crlf.txt",
            "-b",
            "+c",
        ),
    )
    assert (ws / "docs" / "notes.md").read_text() == "# Notes\nfirst\n"
    assert (ws / "src" / "app.py").read_text() == "def main():\n    print('two')\n    return 1\n"
    assert (ws / "src" / "consts.py").read_text() == "X = 1\nY = 3\n"
    assert not (ws / "src" / "util.py").exists() and not (ws / "old.txt").exists()
    assert (ws / "crlf.txt").read_bytes() == b"a\r\nc\r\n"  # its line endings kept
    assert set(output.output_paths) == {
        "docs/notes.md",
        "src/app.py",
        "src/util.py",
        "src/consts.py",
        "old.txt",
        "crlf.txt",
    }
    assert "M src/util.py -> src/consts.py" in text(output)


async def test_a_hunk_that_does_not_apply_fails_naming_it_and_changes_nothing(
    project: Sandbox,
) -> None:
    ws = project.workspace
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    with pytest.raises(ToolFailure) as failed:
        await project.call(
            "apply_patch",
            patch_text=patch(
                "*** Add File: new.txt",
                "+new",
                "*** Update File: src/app.py",
                "-    print('one')",
                "+    print('two')",
                "*** Update File: src/util.py",
                "@@",
                "-Z = 9",
                "+Z = 10",
            ),
        )
    assert str(failed.value).startswith("src/util.py: hunk 1 ('Z = 9') does not match the file")
    assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before


async def test_a_write_failing_midway_restores_what_was_written(
    project: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = project.workspace

    def full_disk(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    # The delete, planned after the update, fails once the update is written.
    monkeypatch.setattr(os, "unlink", full_disk)
    with pytest.raises(ToolFailure, match=r"could not be written .*No space left"):
        await project.call(
            "apply_patch",
            patch_text=patch(
                "*** Update File: src/util.py",
                "-Y = 2",
                "+Y = 3",
                "*** Delete File: old.txt",
            ),
        )
    assert (ws / "src" / "util.py").read_text() == "X = 1\nY = 2\n"
    assert (ws / "old.txt").read_text() == "bye\n"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (["*** Add File: ../escape.txt", "+x"], "leads outside the workspace"),
        (["*** Update File: link/secret.txt", "-x", "+y"], "outside the workspace"),
        (["*** Add File: link/new.txt", "+x"], "outside the workspace"),
        (["*** Delete File: link/secret.txt"], "outside the workspace"),
        (["*** Add File: .env", "+TOKEN=1"], "protected"),
        (
            ["*** Update File: src/app.py", "*** Move to: .git/config", "@@", " def main():"],
            "protected",
        ),
    ],
)
async def test_escapes_and_protected_paths_are_refused(
    project: Sandbox, body: list[str], message: str
) -> None:
    ws = project.workspace
    (ws / "link").symlink_to(project.outside)
    project.arm()
    with pytest.raises(ToolFailure, match=message):
        await project.call("apply_patch", patch_text=patch(*body))
    project.assert_untouched()
    assert not (ws / ".env").exists() and not (ws / ".git").exists()
    assert (ws / "src" / "app.py").exists()


@pytest.mark.parametrize(
    ("patch_text", "message"),
    [
        ("*** Update File: a\n", "must start with '*** Begin Patch'"),
        ("*** Begin Patch\n*** Add File: a\n+x\n", "must end with '*** End Patch'"),
        (patch("*** Add File: src/app.py", "+x"), "src/app.py already exists"),
        (patch("*** Update File: nope.py", "-a", "+b"), "nope.py does not exist"),
        (patch("*** Add File: a.txt", "x"), "every line of an added file starts with '+'"),
        (patch("hello"), "expected '*** Add/Update/Delete File: <path>'"),
        (patch(), "the patch changes no file"),
    ],
)
async def test_a_malformed_patch_says_what_is_wrong(
    project: Sandbox, patch_text: str, message: str
) -> None:
    with pytest.raises(ToolFailure, match=re.escape(message)):
        await project.call("apply_patch", patch_text=patch_text)
