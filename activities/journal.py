"""The file-change journal on the host: what workspace paths hold, and putting them back.

Around a call that may change the workspace, ``run_tool`` reads what the paths the tool names
beforehand hold (``capture``: ``write``, ``edit``, ``apply_patch``), runs the tool, and reads
what every path it reports changed holds afterwards (``changes``). ``bash`` cannot name its
paths beforehand: it reports each changed path's metadata from the snapshot taken before the
command, and a revert finds that content in an earlier entry of the journal whose "after" has
the same metadata (``sessionflow/models/journal.py: FileState.same_file``). Content up to the
cap is kept in the store's blob table; unchanged files cost nothing (only named or snapshot-
changed paths are read), and one call keeps at most ``journal_call_bytes`` of content (a
command that rewrote a whole tree is journaled by digest beyond it).

Every path goes through ``Workspace`` (``tools/paths.py``): a protected path, or one leading
outside, is never read, journaled or restored. Symbolic links are recorded as links (their
target), never followed. A restore writes a temporary file beside the path and renames it
over, so a path holds its old or its new content at every moment, and doing it again is
harmless.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from activities.tools.base import ToolFailure, ToolOutput
from activities.tools.paths import READ_FLAGS, PathDenied, Workspace
from activities.tools.settings import ToolSettings
from sessionflow.models.journal import FileChange, FileState

_CHUNK = 1024 * 1024
# A restore's temporary name, beside the path it replaces.
_TEMP_PREFIX = ".sessionflow-revert-"


class Unjournaled(Exception):
    """A path the journal does not follow: protected, outside the workspace, or not a file
    (a directory, a device)."""


@dataclass(frozen=True)
class Seen:
    """A path's state, and its content when within the cap (to keep as a blob)."""

    state: FileState | None
    content: bytes | None = None


def canonical(workspace: Workspace, path: str) -> str:
    """The workspace-relative form of ``path`` (its lexical checks applied)."""
    return "/".join(workspace.parts(path)) or "."


@contextlib.contextmanager
def _parent(workspace: Workspace, rel: str, *, create: bool = False) -> Iterator[int | None]:
    """The descriptor of ``rel``'s directory (None when it does not exist), walked inside
    the workspace; a protected or outside path raises ``Unjournaled``."""
    head, _, _name = rel.rpartition("/")
    try:
        if create and head:
            workspace.open(head, _open_dir_creating, create_dirs=True)  # made if missing
        opened = workspace.open_dir(head or ".")
    except PathDenied as denied:
        raise Unjournaled(str(denied)) from None
    except ToolFailure:
        yield None  # the directory is gone: so is the path
        return
    try:
        yield opened.fd
    finally:
        os.close(opened.fd)


def _open_dir_creating(fd: int, name: str) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=fd)
    return os.open(name, READ_FLAGS | os.O_DIRECTORY, dir_fd=fd)


def read_state(workspace: Workspace, rel: str, cap: int) -> Seen:
    """What ``rel`` holds now: nothing, a file (its digest; its content when within ``cap``)
    or a link (its target)."""
    name = rel.rpartition("/")[2]
    rule = workspace.protected.covers(rel.split("/"))
    if rule is not None:
        raise Unjournaled(f"{rel} is protected (rule {rule!r})")
    with _parent(workspace, rel) as fd:
        if fd is None:
            return Seen(None)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return Seen(None)
        meta = FileState(size=st.st_size, mode=st.st_mode, mtime_ns=st.st_mtime_ns, inode=st.st_ino)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=fd)
            link = {"kind": "symlink", "target": target, "stored": True}
            return Seen(meta.model_copy(update=link))
        if not stat.S_ISREG(st.st_mode):
            raise Unjournaled(f"{rel} is not a regular file")
        digest, content = _read(fd, name, cap)
        state = meta.model_copy(update={"digest": digest, "stored": content is not None})
        return Seen(state, content)


def _read(fd: int, name: str, cap: int) -> tuple[str, bytes | None]:
    """The file's digest, and its bytes when at most ``cap`` (else hashed as it streams)."""
    file = os.open(name, READ_FLAGS, dir_fd=fd)
    try:
        hasher, kept, size = hashlib.sha256(), bytearray(), 0
        while chunk := os.read(file, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
            if size <= cap:
                kept += chunk
        return "sha256:" + hasher.hexdigest(), bytes(kept) if size <= cap else None
    finally:
        os.close(file)


def capture(root: str, settings: ToolSettings, paths: Iterable[str]) -> dict[str, Seen]:
    """What the paths a call names hold before it runs (paths the journal does not follow,
    or that are not valid paths, are left out: the tool refuses them itself)."""
    seen: dict[str, Seen] = {}
    with Workspace(root, settings) as workspace:
        for path in paths:
            try:
                rel = canonical(workspace, path)
                seen[rel] = read_state(workspace, rel, settings.journal_max_bytes)
            except (Unjournaled, ToolFailure, OSError):
                continue
    return seen


def changes(
    root: str, settings: ToolSettings, before: dict[str, Seen], output: ToolOutput
) -> tuple[list[FileChange], list[bytes]]:
    """The journal entries of a call that ran: every path it reported changed, and every
    path it named beforehand that changed, with what each held before and after; and the
    contents to keep."""
    found: list[FileChange] = []
    kept: list[bytes] = []
    budget = settings.journal_call_bytes
    with Workspace(root, settings) as workspace:
        for rel in dict.fromkeys([*output.output_paths, *before]):
            try:
                after = read_state(workspace, rel, settings.journal_max_bytes)
            except (Unjournaled, ToolFailure, OSError):
                continue
            earlier = before.get(rel) or Seen(_seen_before(output, rel))
            if _same(earlier.state, after.state):
                continue  # named beforehand, left as it was
            contents = [seen.content for seen in (earlier, after) if seen.content is not None]
            if sum(map(len, contents)) > budget:  # a call that rewrote a whole tree
                earlier, after = _unkept(earlier), _unkept(after)
                contents = []
            budget -= sum(map(len, contents))
            found.append(FileChange(path=rel, before=earlier.state, after=after.state))
            kept += contents
    return found, kept


def _unkept(seen: Seen) -> Seen:
    """``seen`` by digest only: the call's content budget is spent."""
    state = seen.state
    if state is None or state.kind != "file":
        return seen
    return Seen(state.model_copy(update={"stored": False}))


def _seen_before(output: ToolOutput, rel: str) -> FileState | None:
    """The metadata a snapshot saw before the call (None: absent); unknown content otherwise
    (a tool that said what it changed only afterwards)."""
    if output.seen_before is not None and rel in output.seen_before:
        meta = output.seen_before[rel]
        if meta is None:
            return None
        mode, size, mtime_ns, inode = meta
        state = FileState(size=size, mode=mode, mtime_ns=mtime_ns, inode=inode)
        return state.model_copy(update={"kind": "symlink"}) if stat.S_ISLNK(mode) else state
    return FileState()  # nothing known of it: a revert cannot restore it


def _same(one: FileState | None, other: FileState | None) -> bool:
    if one is None or other is None:
        return one is other
    return one.same_content(other) and one.mode == other.mode


def restore(workspace: Workspace, rel: str, to: FileState | None, content: bytes | None) -> None:
    """Make ``rel`` hold ``to`` (None: nothing): a file (``content``) or a link, renamed over
    the path from a temporary beside it; a path that already holds it is left as it is."""
    rule = workspace.protected.covers(rel.split("/"))
    if rule is not None:
        raise Unjournaled(f"{rel} is protected (rule {rule!r})")
    name = rel.rpartition("/")[2]
    with _parent(workspace, rel, create=to is not None) as fd:
        if fd is None:
            return  # to is None and its directory is gone: nothing to delete
        if to is None:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    raise Unjournaled(f"{rel} is now a directory")
                os.unlink(name, dir_fd=fd)
            return
        temp = f"{_TEMP_PREFIX}{secrets.token_hex(6)}"
        try:
            if to.kind == "symlink":
                os.symlink(to.target or "", temp, dir_fd=fd)
            else:
                _write_new(fd, temp, content or b"", to.mode)
            os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=fd)
            raise
        os.fsync(fd)


def _write_new(fd: int, name: str, content: bytes, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    file = os.open(name, flags, 0o600, dir_fd=fd)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(file, view) :]
        os.fchmod(file, stat.S_IMODE(mode))
        os.fsync(file)
    finally:
        os.close(file)
