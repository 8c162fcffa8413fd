"""``apply_patch``: a multi-file patch (add, update with context hunks, delete, move) applied
all or nothing inside the workspace (the format: ``patch.py``).

Every path goes through the workspace's confinement as ``edit``'s does (``paths.Workspace``:
walked by descriptor, symbolic links resolved inside the workspace only, protected paths
refused). The whole patch is planned first -- every file read, every hunk located, every new
content computed -- and only then written; a write that fails midway (a full disk) restores
what the patch had written before it. A hunk that does not apply fails the call naming the file
and the hunk, and nothing is changed.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.files import encode_text, looks_binary, rewrite
from activities.tools.output import text_output
from activities.tools.patch import FileChange, PatchError, apply, parse
from activities.tools.paths import WRITE_FLAGS, Workspace
from activities.tools.settings import ToolSettings


class ApplyPatchInput(BaseModel):
    patch_text: str = Field(
        description=(
            "The patch, from '*** Begin Patch' to '*** End Patch': '*** Add File: <path>' "
            "(lines prefixed '+'), '*** Update File: <path>' (optionally '*** Move to: <path>', "
            "then '@@' hunks of ' ' context, '-' removed and '+' added lines), "
            "'*** Delete File: <path>'"
        )
    )


@dataclass
class _Step:
    """One file's change, planned: what to write (None: delete) and what was there."""

    path: str
    before: bytes | None  # None: the file did not exist
    after: bytes | None  # None: the file goes


class ApplyPatch(Tool[ApplyPatchInput]):
    name = "apply_patch"
    description = (
        "Apply a patch that adds, updates (by context hunks), moves and deletes files of the "
        "workspace, all or nothing. Prefer it to several edits when one change spans files."
    )
    input_model = ApplyPatchInput
    retry_safe = False  # applied twice, an update's hunks no longer match, or match again

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: ApplyPatchInput, context: ToolContext) -> ToolOutput:
        return await asyncio.to_thread(self._apply, input.patch_text, str(context.workspace))

    def touches(self, input: ApplyPatchInput) -> tuple[str, ...]:
        try:
            changes = parse(input.patch_text)
        except ToolFailure:
            return ()  # it fails before it changes anything
        paths = [c.path for c in changes] + [c.move_to for c in changes if c.move_to]
        return tuple(dict.fromkeys(paths))

    def _apply(self, text: str, root: str) -> ToolOutput:
        changes = parse(text)
        with Workspace(root, self.settings) as workspace:
            steps = self._plan(workspace, changes)
            self._write_all(workspace, steps)
        paths = tuple(dict.fromkeys(step.path for step in steps))
        summary = "\n".join(_describe(change) for change in changes)
        return text_output(
            f"Applied the patch:\n{summary}",
            self.settings.output_cap,
            paths=paths,
            files=len(paths),
        )

    # --- planning: read everything, change nothing ------------------------------------------------

    def _plan(self, workspace: Workspace, changes: list[FileChange]) -> list[_Step]:
        steps: list[_Step] = []
        touched: dict[str, bytes | None] = {}  # a path's content as the patch leaves it so far

        def current(path: str) -> bytes | None:
            return touched[path] if path in touched else self._read(workspace, path)

        for change in changes:
            for step in self._steps(workspace, change, current):
                touched[step.path] = step.after
                steps.append(step)
        return steps

    def _steps(
        self, workspace: Workspace, change: FileChange, current: Callable[[str], bytes | None]
    ) -> list[_Step]:
        path = self._rel(workspace, change.path)
        before = current(path)
        if change.kind == "add":
            if before is not None:
                raise PatchError(f"{path} already exists; use '*** Update File: {path}'")
            return [_Step(path, None, encode_text(_joined(change.lines), path))]
        if before is None:
            raise PatchError(f"{path} does not exist")
        if change.kind == "delete":
            return [_Step(path, before, None)]
        if b"\0" in before or looks_binary(before[:8192]):
            raise PatchError(f"{path} is a binary file; apply_patch changes text files only")
        after = encode_text(apply(change, before.decode("utf-8", "surrogateescape")), path)
        if change.move_to is None:
            return [_Step(path, before, after)]
        target = self._rel(workspace, change.move_to)
        if target != path and current(target) is not None:
            raise PatchError(f"cannot move {path} to {target}: {target} already exists")
        return [_Step(path, before, None), _Step(target, None, after)]

    def _rel(self, workspace: Workspace, path: str) -> str:
        """The workspace-relative path, checked (outside the workspace: refused here)."""
        parts = workspace.parts(path)
        if not parts:
            raise PatchError(f"{path!r} names the workspace itself, not a file")
        return posixpath.join(*parts)

    def _read(self, workspace: Workspace, path: str) -> bytes | None:
        try:
            opened = workspace.open_file(path)
        except ToolFailure as failure:
            if str(failure) == f"{path} does not exist":
                return None
            raise
        try:
            if opened.st.st_size > self.settings.max_file_bytes:
                raise PatchError(f"{path} is {opened.st.st_size} bytes, over the edit limit")
            return os.pread(opened.fd, opened.st.st_size, 0)
        finally:
            os.close(opened.fd)

    # --- writing: all, or back to where it was ----------------------------------------------------

    def _write_all(self, workspace: Workspace, steps: list[_Step]) -> None:
        done: list[_Step] = []
        try:
            for step in steps:
                _put(workspace, step.path, step.after)
                done.append(step)
        except (OSError, ToolFailure) as error:
            for step in reversed(done):
                _put(workspace, step.path, step.before)
            raise ToolFailure(
                f"the patch could not be written ({error}); nothing changed"
            ) from None


def _put(workspace: Workspace, path: str, data: bytes | None) -> None:
    """Make ``path`` hold ``data`` (None: absent), through the workspace's confinement."""
    if data is None:
        parent, name = posixpath.split(path)
        opened = workspace.open_dir(parent or ".")
        try:
            # The same checks as a read first: a protected or linked-out path is refused.
            os.close(workspace.open_file(path).fd)
            os.unlink(name, dir_fd=opened.fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(opened.fd)
        return
    opened = workspace.open(
        path, lambda fd, name: os.open(name, WRITE_FLAGS, 0o666, dir_fd=fd), create_dirs=True
    )
    try:
        workspace.check_file(path, opened)
        rewrite(opened.fd, data)
    finally:
        os.close(opened.fd)


def _joined(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def _describe(change: FileChange) -> str:
    if change.kind == "update" and change.move_to:
        return f"M {change.path} -> {change.move_to}"
    return {"add": "A", "update": "M", "delete": "D"}[change.kind] + f" {change.path}"
