"""Limits and protected paths of the built-in tools, in one frozen object with documented defaults.

Protected paths are never read, written, listed, scanned or watched. ``protected`` holds globs
over workspace-relative paths (``activities/tools/patterns.py``); a path is protected when it or
any of its ancestors matches, so a protected directory is skipped without descending. Defaults:

- ``.git``: repository internals; hooks run code and config can point anywhere.
- ``.env*``: environment files, where local secrets live.
- ``*.pem``, ``*.key``, ``id_rsa*``, ``id_dsa*``, ``id_ecdsa*``, ``id_ed25519*``: key files.
- ``.sessionflow``, ``sessionflow.db*``, ``*.db-wal``, ``*.db-shm``: the engine's own database
  and its WAL; a tool writing there would corrupt the session it runs in.

``protected_paths`` holds absolute paths: by default the platform's list (reference §8.5; none on
Linux); add ``database_paths(url)`` when the store's SQLite file has a name the globs miss.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.engine import make_url

DEFAULT_PROTECTED: tuple[str, ...] = (
    ".git",
    ".env*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    ".sessionflow",
    "sessionflow.db*",
    "*.db-wal",
    "*.db-shm",
)

# Variables a command must not see: the engine's own configuration (database URLs carry
# credentials) and model provider keys.
DEFAULT_HIDDEN_ENV: tuple[str, ...] = (
    "SESSIONFLOW_*",
    "TEMPORAL_*",
    "*_API_KEY",
)

_MACOS_HOME = ("Music", "Pictures", "Movies", "Downloads", "Desktop", "Documents", "Public")
_MACOS_LIBRARY = (
    "Application Support/AddressBook",
    "Calendars",
    "Mail",
    "Messages",
    "Safari",
    "Cookies",
    "Application Support/com.apple.TCC",
    "PersonalizationPortrait",
    "Metadata/CoreSpotlight",
    "Suggestions",
)
_MACOS_ROOT = ("/.DocumentRevisions-V100", "/.Spotlight-V100", "/.Trashes", "/.fseventsd")
_WINDOWS_HOME = ("AppData", "Downloads", "Desktop", "Documents", "Pictures", "Music", "Videos")


def platform_protected(platform: str = sys.platform, home: Path | None = None) -> tuple[Path, ...]:
    """Reference §8.5: the directories never watched, stat'ed or scanned on this platform."""
    home = home or Path(os.path.expanduser("~"))
    if platform == "darwin":
        library = home / "Library"
        return (
            *(home / name for name in (*_MACOS_HOME, "Applications", "Library")),
            *(library / name for name in _MACOS_LIBRARY),
            *(Path(name) for name in _MACOS_ROOT),
        )
    if platform == "win32":
        return tuple(home / name for name in (*_WINDOWS_HOME, "OneDrive"))
    return ()


def database_paths(url: str) -> tuple[Path, ...]:
    """The SQLite file of a store URL with its WAL, shared-memory and journal files; none for
    a server database."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return ()
    if parsed.database == ":memory:":
        return ()
    base = os.path.abspath(parsed.database)
    return tuple(Path(base + suffix) for suffix in ("", "-wal", "-shm", "-journal"))


def _default_shell() -> str:
    return "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"


@dataclass(frozen=True)
class ToolSettings:
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    protected_paths: tuple[Path, ...] = field(default_factory=platform_protected)
    # Bytes of text one call returns to the model.
    output_cap: int = 50_000
    # Bytes of a command's output the store keeps when the model's copy was cut (in the
    # tool.success event's ``output``; never in a Temporal payload).
    store_cap: int = 1_000_000
    read_lines: int = 2000
    line_chars: int = 2000
    # Largest file edit rewrites or grep searches.
    max_file_bytes: int = 10 * 1024 * 1024
    list_entries: int = 1000
    glob_results: int = 1000
    grep_matches: int = 200
    # Directory entries one list/glob/grep visits before it stops and says so.
    scan_entries: int = 100_000
    max_depth: int = 64
    shell: str = field(default_factory=_default_shell)
    bash_timeout: float = 120.0
    bash_max_timeout: float = 600.0
    # Between SIGTERM and SIGKILL of a command's process group.
    kill_grace: float = 2.0
    hidden_env: tuple[str, ...] = DEFAULT_HIDDEN_ENV
    progress_interval: float = 2.0
    # A workspace with more entries than this is not snapshot around bash; its changes then
    # go untracked rather than making every command scan a huge tree.
    track_entries: int = 20_000
    # The file-change journal keeps a changed file's content up to this size (a revert can
    # restore it); a larger file is journaled by digest only (``SESSIONFLOW_JOURNAL_MAX_BYTES``).
    journal_max_bytes: int = 1024 * 1024
    # What one call may keep in all (a command that rewrote a tree: digests only beyond it).
    journal_call_bytes: int = 64 * 1024 * 1024
    # ``bash`` runs in a bubblewrap sandbox (``sandbox.py``); False only by the explicit
    # ``SESSIONFLOW_SANDBOX=off``. ``sandbox_binary`` overrides the bundled ``bwrap``.
    sandbox: bool = True
    sandbox_binary: str | None = None
    # Paths the sandbox shows read-only beside the toolchains it finds, and paths it hides
    # (a toolchain root or a secret in one): ``toolchain.py``.
    sandbox_mount: tuple[str, ...] = ()
    sandbox_hide: tuple[str, ...] = ()
