"""Protected paths are never read, written, listed or scanned, and protected directories are
skipped without being opened."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from activities.tools.changes import snapshot
from activities.tools.paths import PathDenied
from activities.tools.settings import (
    DEFAULT_PROTECTED,
    ToolSettings,
    database_paths,
    platform_protected,
)
from tests.activities.tools.conftest import DIR_MASK, Inotify, Sandbox, text

MARK = "PROTECTED-MARK"
PROTECTED_FILES = (
    ".git/config",
    ".git/hooks/pre-commit",
    ".env",
    ".env.local",
    "sub/.env",
    "server.pem",
    "tls/server.key",
    "id_rsa",
    "home/.ssh/id_ed25519.pub",
    ".sessionflow/sessionflow.db",
    ".sessionflow/sessionflow.db-wal",
    "sessionflow.db",
    "sessionflow.db-wal",
    "other.db-wal",
    "other.db-shm",
    "sub/.git",
)


@pytest.fixture
def guarded(sandbox: Sandbox) -> Sandbox:
    for rel in PROTECTED_FILES:
        path = sandbox.workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{MARK} {rel}\n")
    (sandbox.workspace / "sub" / "visible.txt").write_text("visible\n")
    (sandbox.workspace / "innocent").symlink_to(".env")
    (sandbox.workspace / "repo").symlink_to(".git")
    return sandbox


@pytest.mark.parametrize(
    "rel", [*PROTECTED_FILES, ".git", "innocent", "repo/config", ".sessionflow"]
)
async def test_protected_paths_are_denied_to_every_file_tool(guarded: Sandbox, rel: str) -> None:
    """Catalogue D4: path traversal."""
    calls = {
        "read": {"path": rel},
        "write": {"path": rel, "content": "x"},
        "edit": {"path": rel, "old_string": MARK, "new_string": "x"},
        "list": {"path": rel},
        "glob": {"pattern": "*", "path": rel},
        "grep": {"pattern": MARK, "path": rel},
    }
    for tool, arguments in calls.items():
        with pytest.raises(PathDenied, match="protected"):
            await guarded.call(tool, **arguments)
    target = guarded.workspace / rel
    if target.is_file():
        assert target.read_text().startswith(MARK)


async def test_walks_skip_protected_paths_without_opening_them(guarded: Sandbox) -> None:
    watcher = Inotify()
    for rel in (".git", ".git/hooks", ".sessionflow"):
        watcher.watch(guarded.workspace / rel, DIR_MASK)
    try:
        listing = text(await guarded.call("list", path=".", depth=10))
        globbed = text(await guarded.call("glob", pattern="**/*"))
        dotted = text(await guarded.call("glob", pattern="**/.env*"))
        grepped = text(await guarded.call("grep", pattern=MARK))
        assert watcher.events() == []
    finally:
        watcher.close()
    for rel in PROTECTED_FILES:
        assert rel not in listing.splitlines() and rel not in globbed.splitlines()
    assert "sub/visible.txt" in listing and "sub/visible.txt" in globbed
    assert ".git" not in listing and ".sessionflow" not in listing
    assert "No files match" in dotted
    assert grepped.startswith("No matches")


async def test_change_tracking_skips_protected_paths(guarded: Sandbox) -> None:
    state = snapshot(str(guarded.workspace), guarded.settings)
    assert state is not None
    assert set(state) == {"sub/visible.txt", "innocent", "repo"}


async def test_configured_globs_and_absolute_paths(sandbox: Sandbox) -> None:
    (sandbox.workspace / "secrets").mkdir()
    (sandbox.workspace / "secrets" / "a.txt").write_text("a")
    (sandbox.workspace / "secrets" / "b.md").write_text("b")
    (sandbox.workspace / "store.sqlite").write_text("db")
    sandbox.settings = dataclasses.replace(
        sandbox.settings,
        protected=(*DEFAULT_PROTECTED, "secrets/*.txt"),
        protected_paths=(sandbox.workspace / "store.sqlite", Path("/elsewhere/x.db")),
    )
    for path in ("secrets/a.txt", "store.sqlite", str(sandbox.workspace / "store.sqlite")):
        with pytest.raises(PathDenied, match="protected"):
            await sandbox.call("read", path=path)
    assert text(await sandbox.call("read", path="secrets/b.md")).endswith("b")
    assert text(await sandbox.call("glob", pattern="**/*")).splitlines() == ["secrets/b.md"]


def test_platform_lists_follow_the_reference() -> None:
    home = Path("/home/u")
    assert platform_protected("linux", home) == ()
    mac = platform_protected("darwin", home)
    assert home / "Library" / "Mail" in mac and Path("/.Spotlight-V100") in mac
    assert home / "AppData" in platform_protected("win32", home)
    assert ToolSettings().protected == DEFAULT_PROTECTED


async def test_the_store_database_can_be_protected_by_its_url(sandbox: Sandbox) -> None:
    """Catalogue D4: path traversal."""
    (sandbox.workspace / "state.sqlite3-wal").write_text("wal")
    url = f"sqlite+aiosqlite:///{sandbox.workspace}/state.sqlite3"
    sandbox.settings = dataclasses.replace(sandbox.settings, protected_paths=database_paths(url))
    with pytest.raises(PathDenied, match="protected"):
        await sandbox.call("read", path="state.sqlite3-wal")
    with pytest.raises(PathDenied, match="protected"):
        await sandbox.call("write", path="state.sqlite3", content="x")
    assert database_paths("postgresql+psycopg://u@h/db") == ()
    assert database_paths("sqlite+aiosqlite:///:memory:") == ()
