"""Workspace confinement: every path a tool touches is opened inside the session workspace.

Never by string prefix. A path goes through three gates:

1. Lexical refusals, before any system call: NUL, a leading ``~`` (never expanded), percent-
   encoded dots, slashes and backslashes (paths are literal), and anything that normalizes
   outside the workspace (``..`` escapes, absolute paths elsewhere, ``/proc/self/root``). An
   absolute path under the workspace is accepted as its relative form. ``a/../b`` is read as
   ``b``, as a shell's ``cd`` does.
2. A descriptor walk: the workspace root is opened once per call; each component is opened
   relative to its parent's descriptor with ``O_NOFOLLOW``, so the kernel never follows a
   symbolic link for us. A link we meet is read and its target spliced into the path against
   the physical prefix already walked; a target that leaves the workspace is refused and the
   walk restarts from the root. A link swapped in between any check and the open cannot redirect
   us: the open itself refuses it. Protected paths are refused before their first system call,
   on the path as written and again on every spliced path.
3. The opened descriptor: its real path (``/proc/self/fd``, ``F_GETPATH`` on macOS) must lie
   under the root's real path by ``os.path.commonpath`` (a directory moved out from under the
   walk); regular files with more than one hard link are refused, because the other link may be
   outside. Files are opened without ``O_TRUNC`` and checked before a byte is written, so a
   refusal never changes anything outside.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import sys
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from types import TracebackType

from activities.tools.base import ToolFailure
from activities.tools.patterns import Glob
from activities.tools.settings import ToolSettings

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not hang the tool; we refuse non-regular files afterwards.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_LINKS = 40
# What an O_NOFOLLOW open of a symbolic link fails with (Linux/macOS, FreeBSD, O_DIRECTORY).
_LINK_ERRNOS = {errno.ELOOP, errno.EMLINK, errno.ENOTDIR}
_ENCODED = re.compile(r"%(?:2e|2f|5c|00)", re.IGNORECASE)
_FOLD_CASE = sys.platform in ("darwin", "win32")

Opener = Callable[[int, str], int]


class PathDenied(ToolFailure):
    """A path the tools refuse to touch; the message says why."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"Access to {path!r} denied: {reason}")


def fd_path(fd: int) -> str | None:
    """The real path of an open descriptor, from the kernel; None where it cannot tell."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    if sys.platform == "darwin":  # pragma: no cover - macOS only
        import fcntl

        raw = fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024))
        return os.fsdecode(raw.split(b"\0", 1)[0])
    return None


def is_inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def relative_parts(path: str, roots: Sequence[str]) -> list[str] | None:
    """``path`` (absolute) relative to the first root it lies under, lexically; else None."""
    norm = posixpath.normpath(path)
    for root in roots:
        if is_inside(norm, root):
            rel = posixpath.relpath(norm, root)
            return [] if rel == "." else rel.split("/")
    return None


@dataclass(frozen=True)
class Protected:
    """Protected paths of one workspace: globs plus absolute paths made relative to it."""

    globs: tuple[Glob, ...]
    prefixes: tuple[tuple[str, ...], ...]

    @classmethod
    def for_root(cls, settings: ToolSettings, roots: Sequence[str]) -> Protected:
        globs = tuple(Glob(pattern, fold_case=_FOLD_CASE) for pattern in settings.protected)
        # Lexical on purpose: resolving these would stat the very paths we must not touch.
        prefixes = []
        for path in settings.protected_paths:
            parts = relative_parts(os.path.abspath(path), roots)
            if parts:
                prefixes.append(tuple(parts))
        return cls(globs, tuple(prefixes))

    def match(self, parts: Sequence[str]) -> str | None:
        """The rule protecting exactly this path (its ancestors are checked separately)."""
        rel = "/".join(parts)
        for glob in self.globs:
            if glob.matches(rel):
                return glob.pattern
        for prefix in self.prefixes:
            if tuple(parts) == prefix:
                return "/".join(prefix)
        return None

    def covers(self, parts: Sequence[str]) -> str | None:
        """The rule protecting this path or one of its ancestors."""
        for end in range(1, len(parts) + 1):
            rule = self.match(parts[:end])
            if rule is not None:
                return rule
        return None


@dataclass(frozen=True)
class Opened:
    fd: int
    rel: str
    st: os.stat_result


class _Link(Exception):
    """A symbolic link met during the walk, to be spliced into the path."""

    def __init__(self, prefix: list[str], name: str, target: str, rest: list[str]) -> None:
        super().__init__(target)
        self.prefix, self.name, self.target, self.rest = prefix, name, target, rest

    @property
    def rel(self) -> str:
        return _join([*self.prefix, self.name])


def _join(parts: Sequence[str]) -> str:
    return "/".join(parts) or "."


def _close(fd: int, root: int) -> None:
    if fd != root:
        os.close(fd)


class Workspace:
    """One call's view of the session workspace: the root opened once, every path walked from it.

    Use as a context manager; descriptors it returns in ``Opened`` belong to the caller.
    """

    def __init__(self, root: os.PathLike[str] | str, settings: ToolSettings) -> None:
        self.settings = settings
        self.given = os.path.abspath(root)
        try:
            self.fd = os.open(self.given, DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError as error:
            raise ToolFailure(
                f"Workspace {self.given} is not a usable directory: {error}"
            ) from None
        self.real = fd_path(self.fd) or os.path.realpath(self.given)
        self.protected = Protected.for_root(settings, (self.real, self.given))

    def __enter__(self) -> Workspace:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        os.close(self.fd)

    def parts(self, path: str) -> list[str]:
        """Gate 1: the lexical refusals; the path's components relative to the root."""
        if not path:
            raise ToolFailure("A path is required; use '.' for the workspace root")
        if "\x00" in path:
            raise PathDenied(path, "the path contains a NUL byte")
        if encoded := _ENCODED.search(path):
            reason = f"it contains {encoded.group()!r}; paths are literal, pass the decoded path"
            raise PathDenied(path, reason)
        if path.startswith("~"):
            raise PathDenied(path, "'~' is not expanded; use a path relative to the workspace")
        if posixpath.isabs(path):
            parts = relative_parts(path, (self.given, self.real))
            if parts is None:
                raise PathDenied(path, f"it is outside the workspace {self.given}")
            return parts
        norm = posixpath.normpath(path)
        if norm == ".." or norm.startswith("../"):
            raise PathDenied(path, "it leads outside the workspace")
        return [] if norm == "." else norm.split("/")

    def open_dir(self, path: str) -> Opened:
        # Without O_DIRECTORY, so that a file is reported as such rather than as a bad path.
        opened = self.open(path, lambda fd, name: os.open(name, READ_FLAGS, dir_fd=fd))
        if not stat.S_ISDIR(opened.st.st_mode):
            os.close(opened.fd)
            raise ToolFailure(f"{opened.rel} is not a directory")
        return opened

    def open_file(
        self, path: str, *, write: bool = False, create: bool = False, create_dirs: bool = False
    ) -> Opened:
        """A regular file with a single link; ``write`` opens it read-write (never truncated
        here: the caller writes only after the checks), ``create`` makes it if absent."""
        flags = (WRITE_FLAGS if create else WRITE_FLAGS & ~os.O_CREAT) if write else READ_FLAGS
        opened = self.open(
            path, lambda fd, name: os.open(name, flags, 0o666, dir_fd=fd), create_dirs=create_dirs
        )
        try:
            self.check_file(path, opened)
        except BaseException:
            os.close(opened.fd)
            raise
        return opened

    def open(self, path: str, opener: Opener, *, create_dirs: bool = False) -> Opened:
        """Gates 2 and 3: walk to ``path`` by descriptor and open its last component."""
        parts = self.parts(path)
        for _ in range(MAX_LINKS):
            try:
                fd = self._walk(path, parts, opener, create_dirs)
            except _Link as link:
                parts = self._splice(path, link)
                continue
            except OSError as error:
                raise _failure(_join(parts), error) from None
            return self._checked(path, parts, fd)
        raise PathDenied(path, f"more than {MAX_LINKS} symbolic links")

    def _walk(self, path: str, parts: list[str], opener: Opener, create_dirs: bool) -> int:
        rule = self.protected.covers(parts)
        if rule is not None:
            raise PathDenied(path, f"{_join(parts)} is protected (rule {rule!r})")
        current = self.fd
        try:
            for index in range(len(parts) - 1):
                child = self._descend(current, parts, index, create_dirs)
                _close(current, self.fd)
                current = child
            name = parts[-1] if parts else "."
            try:
                return opener(current, name)
            except OSError as error:
                self._raise_if_link(error, current, parts, len(parts) - 1)
                raise
        finally:
            _close(current, self.fd)

    def _descend(self, fd: int, parts: list[str], index: int, create: bool) -> int:
        name = parts[index]
        try:
            return os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as error:
            self._raise_if_link(error, fd, parts, index)
            raise
        # Made concurrently? The open below checks what it is.
        with suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=fd)
        return os.open(name, DIR_FLAGS, dir_fd=fd)

    @staticmethod
    def _raise_if_link(error: OSError, fd: int, parts: list[str], index: int) -> None:
        if error.errno not in _LINK_ERRNOS or index < 0:
            return
        try:
            target = os.readlink(parts[index], dir_fd=fd)
        except OSError:
            return
        raise _Link(parts[:index], parts[index], target, parts[index + 1 :])

    def _splice(self, path: str, link: _Link) -> list[str]:
        if posixpath.isabs(link.target):
            base = relative_parts(link.target, (self.given, self.real))
            if base is None:
                reason = f"{link.rel} is a symbolic link to {link.target}, outside the workspace"
                raise PathDenied(path, reason)
            combined = [*base, *link.rest]
        else:
            combined = [*link.prefix, link.target, *link.rest]
        norm = posixpath.normpath("/".join(combined)) if combined else "."
        if norm == ".." or norm.startswith("../"):
            reason = f"{link.rel} is a symbolic link to {link.target}, outside the workspace"
            raise PathDenied(path, reason)
        return [] if norm == "." else norm.split("/")

    def _checked(self, path: str, parts: list[str], fd: int) -> Opened:
        try:
            real = fd_path(fd)
            if real is not None and not is_inside(real, self.real):
                raise PathDenied(path, f"it resolves to {real}, outside the workspace")
            return Opened(fd, _join(parts), os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def check_file(path: str, opened: Opened) -> None:
        """Refuse anything but a regular file with a single link."""
        if stat.S_ISDIR(opened.st.st_mode):
            raise ToolFailure(f"{opened.rel} is a directory")
        if not stat.S_ISREG(opened.st.st_mode):
            raise PathDenied(path, f"{opened.rel} is not a regular file")
        if opened.st.st_nlink > 1:
            reason = (
                f"{opened.rel} has {opened.st.st_nlink} hard links; another link may be outside "
                f"the workspace, so hard-linked files are neither read nor written"
            )
            raise PathDenied(path, reason)


def _failure(rel: str, error: OSError) -> ToolFailure:
    if isinstance(error, FileNotFoundError):
        return ToolFailure(f"{rel} does not exist")
    if isinstance(error, IsADirectoryError):
        return ToolFailure(f"{rel} is a directory")
    if isinstance(error, NotADirectoryError):
        return ToolFailure(f"{rel}: a component of the path is not a directory")
    if isinstance(error, PermissionError):
        return ToolFailure(f"{rel}: permission denied")
    return ToolFailure(f"{rel}: {error.strerror or error}")
