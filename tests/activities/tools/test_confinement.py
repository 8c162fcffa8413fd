"""Every escape of the list is denied by every path tool, and nothing outside is touched
(reference catalogue D4)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from activities.tools.base import ToolFailure
from activities.tools.paths import READ_FLAGS, Opener, PathDenied, Workspace
from tests.activities.tools.conftest import Sandbox, text

PATH_TOOLS = ("read", "write", "edit", "list", "glob", "grep")


def arguments(tool: str, path: str, secret: str) -> dict[str, Any]:
    return {
        "read": {"path": path},
        "write": {"path": path, "content": "pwned"},
        "edit": {"path": path, "old_string": secret, "new_string": "pwned"},
        "list": {"path": path},
        "glob": {"pattern": "**/*", "path": path},
        "grep": {"pattern": "TOPSECRET", "path": path},
    }[tool]


@pytest.fixture
def hostile(sandbox: Sandbox) -> Sandbox:
    """A workspace full of ways out."""
    ws, out = sandbox.workspace, sandbox.outside
    (ws / "src").mkdir()
    (ws / "src" / "ok.txt").write_text("inside\n")
    (ws / "link_out").symlink_to(out / "secret.txt")
    (ws / "link_rel_out").symlink_to("../outside/secret.txt")
    (ws / "link_dir_out").symlink_to(out / "dir")
    (ws / "link_proc").symlink_to(f"/proc/self/root{out}/secret.txt")
    (ws / "src" / "deep_out").symlink_to("../../outside/dir")
    (ws / "dangling_out").symlink_to(out / "created-by-tool.txt")
    os.link(out / "secret.txt", ws / "hard")
    return sandbox


def escapes(sandbox: Sandbox) -> list[str]:
    out = sandbox.outside
    return [
        "../outside/secret.txt",
        "src/../../outside/secret.txt",
        str(out / "secret.txt"),
        str(sandbox.workspace / ".." / "outside" / "secret.txt"),
        "~",
        "~/secret.txt",
        "~root/.bashrc",
        "%2e%2e/outside/secret.txt",
        "%2E%2E%2Foutside%2Fsecret.txt",
        "src%2f..%2f..%2foutside",
        "secret\x00.txt",
        f"/proc/self/root{out}/secret.txt",
        "/proc/self/cwd",
        "link_out",
        "link_rel_out",
        "link_dir_out",
        "link_dir_out/f.txt",
        "link_proc",
        "src/deep_out/f.txt",
        "dangling_out",
        "hard",
    ]


@pytest.mark.parametrize("tool", PATH_TOOLS)
async def test_every_escape_is_denied_and_nothing_outside_is_touched(
    hostile: Sandbox, tool: str
) -> None:
    """Catalogue D4: path traversal."""
    hostile.arm()
    for path in escapes(hostile):
        with pytest.raises(ToolFailure) as refused:
            await hostile.call(tool, **arguments(tool, path, hostile.secret))
        assert hostile.secret not in str(refused.value)
        assert str(refused.value), path
    hostile.assert_untouched()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside/secret.txt", "outside the workspace"),
        ("/etc/passwd", "outside the workspace"),
        ("~/x", "'~' is not expanded"),
        ("%2e%2e/x", "percent"),
        ("a\x00b", "NUL"),
        ("/proc/self/root/etc/passwd", "outside the workspace"),
        ("link_out", "symbolic link to"),
        ("link_rel_out", "symbolic link to"),
        ("link_dir_out/f.txt", "symbolic link to"),
        ("link_proc", "symbolic link to"),
        ("hard", "hard links"),
    ],
)
async def test_denials_say_why(hostile: Sandbox, path: str, reason: str) -> None:
    with pytest.raises(PathDenied) as denied:
        await hostile.call("read", path=path)
    message = str(denied.value).replace("percent-encoded", "percent")
    assert reason in message or (reason == "percent" and "%2e" in message)


async def test_walks_from_the_root_never_follow_links_out(hostile: Sandbox) -> None:
    hostile.arm()
    listing = text(await hostile.call("list", path=".", depth=5))
    assert "link_dir_out@" in listing and "link_dir_out/f.txt" not in listing
    globbed = text(await hostile.call("glob", pattern="**/*.txt"))
    assert globbed.splitlines() == ["src/ok.txt"]
    grepped = await hostile.call("grep", pattern="TOPSECRET")
    assert hostile.secret not in text(grepped)
    assert (
        grepped.structured["matches"] == 0 and grepped.structured["skipped"] == 1
    )  # the hard link
    hostile.assert_untouched()


async def test_paths_inside_are_fine_however_written(hostile: Sandbox) -> None:
    ws = hostile.workspace
    (ws / "chain_a").symlink_to("chain_b")
    (ws / "chain_b").symlink_to("src/ok.txt")
    (ws / "abs_inside").symlink_to(ws / "src" / "ok.txt")
    for path in (
        "src/ok.txt",
        "./src//ok.txt",
        "src/../src/ok.txt",
        str(ws / "src/ok.txt"),
        "chain_a",
        "abs_inside",
    ):
        output = await hostile.call("read", path=path)
        assert "inside" in text(output), path
        assert output.structured["path"] == "src/ok.txt"


async def test_link_loops_end_with_a_clear_error(sandbox: Sandbox) -> None:
    (sandbox.workspace / "loop1").symlink_to("loop2")
    (sandbox.workspace / "loop2").symlink_to("loop1")
    with pytest.raises(PathDenied, match="symbolic links"):
        await sandbox.call("read", path="loop1")


async def test_special_files_are_refused_without_blocking(sandbox: Sandbox) -> None:
    os.mkfifo(sandbox.workspace / "fifo")
    for tool in ("read", "write", "edit"):
        with pytest.raises(PathDenied, match="not a regular file"):
            await sandbox.call(tool, **arguments(tool, "fifo", "x"))


async def test_a_write_through_a_hard_link_changes_nothing(hostile: Sandbox) -> None:
    """Catalogue D4: path traversal."""
    hostile.arm()
    with pytest.raises(PathDenied, match="hard links"):
        await hostile.call("write", path="hard", content="")
    hostile.assert_untouched()  # contents compared too


def _swapping(swap: Callable[[], None], *, after: bool = False) -> Opener:
    """The last component's open, with ``swap`` run just before it (after every check of the
    walk) or just after it (before the descriptor's own checks): each interleaving forced."""

    def opener(fd: int, name: str) -> int:
        if not after:
            swap()
        opened = os.open(name, READ_FLAGS, dir_fd=fd)
        if after:
            swap()
        return opened

    return opener


def _read(opened: Any) -> str:
    try:
        return os.read(opened.fd, 4096).decode()
    finally:
        os.close(opened.fd)


def _link_victim_out(sandbox: Sandbox) -> Callable[[], None]:
    ws = sandbox.workspace
    (ws / "victim").write_text("inside\n")

    def swap() -> None:
        (ws / "tmp_link").symlink_to(sandbox.outside / "secret.txt")
        os.replace(ws / "tmp_link", ws / "victim")

    return swap


def test_a_file_swapped_for_a_link_out_before_its_open_is_refused(sandbox: Sandbox) -> None:
    """Catalogue D4: path traversal."""
    swap = _link_victim_out(sandbox)
    sandbox.arm()
    with Workspace(sandbox.workspace, sandbox.settings) as ws, pytest.raises(PathDenied):
        ws.open("victim", _swapping(swap))
    sandbox.assert_untouched()


def test_a_file_swapped_for_a_link_out_after_its_open_stays_the_inside_file(
    sandbox: Sandbox,
) -> None:
    swap = _link_victim_out(sandbox)
    sandbox.arm()
    with Workspace(sandbox.workspace, sandbox.settings) as ws:
        body = _read(ws.open("victim", _swapping(swap, after=True)))
    assert body == "inside\n"  # the descriptor is the inside file, whatever the name became
    sandbox.assert_untouched()


def _dir_fixture(sandbox: Sandbox) -> None:
    ws = sandbox.workspace
    (ws / "real").mkdir()
    (ws / "real" / "f.txt").write_text("inside\n")
    (ws / "d").symlink_to(ws / "real")
    (sandbox.outside / "dir" / "f.txt").write_text(sandbox.secret)


def test_a_directory_link_repointed_out_during_the_walk_cannot_redirect_it(
    sandbox: Sandbox,
) -> None:
    """The walk read ``d``'s target and went on from there: repointing ``d`` is too late."""
    _dir_fixture(sandbox)
    ws = sandbox.workspace

    def swap() -> None:
        (ws / "d_new").symlink_to(sandbox.outside / "dir")
        os.replace(ws / "d_new", ws / "d")

    sandbox.arm()
    with Workspace(ws, sandbox.settings) as workspace:
        assert _read(workspace.open("d/f.txt", _swapping(swap))) == "inside\n"
    sandbox.assert_untouched()


def test_a_walked_directory_replaced_by_a_link_out_cannot_redirect_the_open(
    sandbox: Sandbox,
) -> None:
    """D4: The walk holds the directory's descriptor: a link put in its place is never followed."""
    _dir_fixture(sandbox)
    ws = sandbox.workspace

    def swap() -> None:
        os.rename(ws / "real", ws / "moved")
        (ws / "real").symlink_to(sandbox.outside / "dir")

    sandbox.arm()
    with Workspace(ws, sandbox.settings) as workspace:
        assert _read(workspace.open("real/f.txt", _swapping(swap))) == "inside\n"
    sandbox.assert_untouched()


async def test_a_directory_link_pointing_out_before_the_call_is_refused(
    sandbox: Sandbox,
) -> None:
    _dir_fixture(sandbox)
    ws = sandbox.workspace
    (ws / "d_new").symlink_to(sandbox.outside / "dir")
    os.replace(ws / "d_new", ws / "d")
    sandbox.arm()
    for tool in ("read", "write"):
        with pytest.raises(ToolFailure):
            await sandbox.call(tool, **arguments(tool, "d/f.txt", sandbox.secret))
    sandbox.assert_untouched()


async def test_the_audit_sees_a_read_outside(sandbox: Sandbox) -> None:
    """D4: The audit itself works: a plain read of the outside secret is caught."""
    sandbox.arm()
    (sandbox.outside / "secret.txt").read_text()
    with pytest.raises(AssertionError):
        sandbox.assert_untouched()
