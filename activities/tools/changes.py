"""Which files a step's tools changed, for ``session.step.ended.files``.

``write`` and ``edit`` name the path they changed in ``output_paths``; ``bash`` compares two
snapshots of the workspace taken around the command. Snapshots walk by descriptor and skip
protected paths without descending (``walk.py``), so tracking never stats the database, ``.git``
or key files; a workspace larger than ``ToolSettings.track_entries`` is not tracked at all.

``run_tool`` records ``output_paths`` with ``tool.success``; ``step_files`` is what the drain
puts in the step's end: the union over the step's completed tool parts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from activities.tools.paths import Workspace
from activities.tools.settings import ToolSettings
from activities.tools.walk import Walk
from sessionflow.models.messages import ToolCompleted, ToolPart

# (mode, size, mtime in ns, inode): a rewrite in place changes the mtime, a replace the inode.
Snapshot = dict[str, tuple[int, int, int, int]]


def snapshot(root: str, settings: ToolSettings) -> Snapshot | None:
    """Every non-directory entry of the workspace, or None when there are too many to track."""
    state: Snapshot = {}
    with Workspace(root, settings) as workspace:
        start = workspace.open_dir(".")
        try:
            walk = Walk(
                workspace, start, max_depth=settings.max_depth, budget=settings.track_entries
            )
            for entry in walk:
                if entry.kind == "dir":
                    continue
                try:
                    st = os.stat(entry.name, dir_fd=entry.dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                state[entry.rel] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
        finally:
            os.close(start.fd)
    return None if walk.truncated else state


def changed(before: Snapshot, after: Snapshot) -> tuple[str, ...]:
    """Paths created, modified or deleted between two snapshots, sorted."""
    paths = before.keys() | after.keys()
    return tuple(sorted(path for path in paths if before.get(path) != after.get(path)))


def step_files(parts: Iterable[ToolPart]) -> tuple[str, ...]:
    """The files a step's tools changed: the union of their recorded ``output_paths``."""
    files: set[str] = set()
    for part in parts:
        if isinstance(part.state, ToolCompleted):
            files.update(part.state.output_paths)
    return tuple(sorted(files))
