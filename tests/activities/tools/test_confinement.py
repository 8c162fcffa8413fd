"""Every escape of the list is denied by every path tool, and nothing outside is touched
(reference catalogue D4)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from activities.tools.base import ToolFailure
from activities.tools.paths import PathDenied
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
    hostile.arm()
    with pytest.raises(PathDenied, match="hard links"):
        await hostile.call("write", path="hard", content="")
    hostile.assert_untouched()  # contents compared too


def _swapper(stop: threading.Event, swap: Iterator[None]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            next(swap)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _file_swaps(sandbox: Sandbox) -> Iterator[None]:
    """``victim`` flips between a regular file inside and a link to the secret outside."""
    ws = sandbox.workspace
    while True:
        (ws / "tmp_file").write_text("inside\n")
        os.replace(ws / "tmp_file", ws / "victim")
        yield
        if not (ws / "tmp_link").is_symlink():
            (ws / "tmp_link").symlink_to(sandbox.outside / "secret.txt")
        os.replace(ws / "tmp_link", ws / "victim")
        yield


def _dir_swaps(sandbox: Sandbox) -> Iterator[None]:
    """``d`` flips between a link to a directory inside and a link to one outside."""
    ws = sandbox.workspace
    (ws / "real").mkdir()
    (ws / "real" / "f.txt").write_text("inside\n")
    for target in [ws / "real", sandbox.outside / "dir"] * 1_000_000:
        (ws / "d_new").symlink_to(target)
        os.replace(ws / "d_new", ws / "d")
        yield


@pytest.mark.parametrize(("swaps", "path"), [(_file_swaps, "victim"), (_dir_swaps, "d/f.txt")])
async def test_links_swapped_between_check_and_use_never_lead_out(
    sandbox: Sandbox, swaps: Any, path: str
) -> None:
    swap = swaps(sandbox)
    next(swap)
    sandbox.arm()
    stop = threading.Event()
    thread = _swapper(stop, swap)
    outcomes = {"read": 0, "denied": 0, "wrote": 0}
    try:
        for _ in range(150):
            try:
                assert sandbox.secret not in text(await sandbox.call("read", path=path))
                outcomes["read"] += 1
                await sandbox.call("write", path=path, content="inside\n")
                outcomes["wrote"] += 1
            except ToolFailure:
                outcomes["denied"] += 1
    finally:
        stop.set()
        thread.join()
    assert outcomes["denied"] > 0 and outcomes["read"] > 0
    sandbox.assert_untouched()


async def test_the_audit_sees_a_read_outside(sandbox: Sandbox) -> None:
    """The audit itself works: a plain read of the outside secret is caught."""
    sandbox.arm()
    (sandbox.outside / "secret.txt").read_text()
    with pytest.raises(AssertionError):
        sandbox.assert_untouched()
