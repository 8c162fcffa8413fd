"""Directory walks for ``list``, ``glob``, ``grep`` and change tracking, by descriptor.

Each directory is opened relative to its parent with ``O_NOFOLLOW``: links are reported, never
followed, so a walk cannot leave the workspace. A protected entry is dropped by name before it is
stat'ed or opened, so protected directories are never descended into. A walk stops after a
budget of entries and says so in ``truncated``.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from activities.tools.paths import DIR_FLAGS, Opened, Workspace

Kind = Literal["dir", "file", "link", "other"]


@dataclass(frozen=True)
class Entry:
    """One directory entry. ``dir_fd`` is its parent's descriptor, valid only until the walk
    moves on: open the entry relative to it (with ``O_NOFOLLOW``) to stay on the walked path."""

    parts: tuple[str, ...]
    depth: int
    kind: Kind
    dir_fd: int

    @property
    def name(self) -> str:
        return self.parts[-1]

    @property
    def rel(self) -> str:
        return "/".join(self.parts)


def _kind(entry: os.DirEntry[str]) -> Kind:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


@dataclass
class Walk:
    """Depth-first, names sorted, below ``start`` (which the walk does not close)."""

    workspace: Workspace
    start: Opened
    max_depth: int
    budget: int
    visited: int = 0
    protected_skipped: int = 0
    truncated: bool = False
    # Told of every protected entry the walk skips (the shell sandbox masks them).
    on_protected: Callable[[tuple[str, ...], Kind], None] | None = None
    # Set when the awaiting task is cancelled: a thread cannot be interrupted, only asked.
    stop: threading.Event = field(default_factory=threading.Event)
    _base: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self._base = () if self.start.rel == "." else tuple(self.start.rel.split("/"))

    def relative(self, entry: Entry) -> str:
        """The entry's path relative to the walk's start."""
        return "/".join(entry.parts[len(self._base) :])

    def __iter__(self) -> Iterator[Entry]:
        return self._entries(self.start.fd, self._base, 1)

    def _children(self, fd: int) -> list[tuple[str, Kind]]:
        # Never read more names than the budget allows: a directory may hold millions.
        room = self.budget - self.visited + 1
        with os.scandir(fd) as listing:
            return sorted((entry.name, _kind(entry)) for entry in itertools.islice(listing, room))

    def _entries(self, fd: int, parts: tuple[str, ...], depth: int) -> Iterator[Entry]:
        for name, kind in self._children(fd):
            if self.visited >= self.budget or self.stop.is_set():
                self.truncated = True
                return
            self.visited += 1
            child = (*parts, name)
            if self.workspace.protected.match(child) is not None:
                self.protected_skipped += 1
                if self.on_protected is not None:
                    self.on_protected(child, kind)
                continue
            yield Entry(child, depth, kind, fd)
            if kind == "dir" and depth < self.max_depth:
                yield from self._descend(fd, child, depth)

    def _descend(self, fd: int, parts: tuple[str, ...], depth: int) -> Iterator[Entry]:
        try:
            sub = os.open(parts[-1], DIR_FLAGS, dir_fd=fd)
        except OSError:
            return  # gone, or swapped for a link since it was listed: not ours to follow
        try:
            yield from self._entries(sub, parts, depth + 1)
        finally:
            os.close(sub)
