"""The file-change journal: what each workspace path held before and after a tool call.

A call that changes the workspace records one ``FileChange`` per path it changed, in its
``session.files.changed`` event (written with the call's settlement). A state names the
content by digest; the content itself is in the store's blob table when it was at most the
journal's content cap. A revert (``activities/rewind.py``) reads the journal back and plans,
path by path, what to restore. Pure models: nothing here reads a file.
"""

from __future__ import annotations

from typing import Literal, Protocol, TypeVar

from sessionflow.models.common import Model


class HasSeq(Protocol):
    @property
    def seq(self) -> int: ...


class FileState(Model):
    """One path's state at a moment: a regular file (``digest`` of its bytes) or a symlink
    (``target``, never followed). ``digest`` None: the content was not read then (the shell's
    view before a command is its files' metadata only); ``stored``: the content is in the blob
    table (it was within the cap). ``size``, ``mtime_ns`` and ``inode`` identify the content
    while nothing rewrote the file (a later call's "before" is this "after" while they match)."""

    kind: Literal["file", "symlink"] = "file"
    digest: str | None = None
    size: int = 0
    mode: int = 0o644
    mtime_ns: int = 0
    inode: int = 0
    stored: bool = False
    target: str | None = None

    def same_file(self, other: FileState) -> bool:
        """Whether ``other`` is, by its metadata, this very content (nothing rewrote it)."""
        return (self.kind, self.size, self.mtime_ns, self.inode, self.mode & 0o7777) == (
            other.kind,
            other.size,
            other.mtime_ns,
            other.inode,
            other.mode & 0o7777,
        )

    def same_content(self, other: FileState | None) -> bool:
        """Whether ``other`` holds the same content (digest or link target) and kind."""
        if other is None or other.kind != self.kind:
            return False
        if self.kind == "symlink":
            return self.target == other.target
        return self.digest is not None and self.digest == other.digest


class FileChange(Model):
    """A path a call changed: ``before`` None means it did not exist, ``after`` None that the
    call deleted it."""

    path: str
    before: FileState | None = None
    after: FileState | None = None


RevertAction = Literal["restore", "delete", "unchanged"]
RevertRefusal = Literal["changed-since", "unknown-before", "content-not-kept", "unsafe-path"]


class RevertPath(Model):
    """One path of a revert's plan: what it holds now, what the revert gives it back
    (``to``; None: deleted), and why it is refused, if it is."""

    path: str
    action: RevertAction
    now: FileState | None = None
    to: FileState | None = None
    # What the session last left there (the journal's latest "after"): a path holding it is
    # safe to restore, and an unrevert gives it back.
    expected: FileState | None = None
    forced: bool = False
    refused: RevertRefusal | None = None
    reason: str | None = None
    # A diff summary for the dry run: lines added and removed (text files within the cap).
    added: int | None = None
    removed: int | None = None


class RevertPlan(Model):
    """What a revert to ``message_id`` (or an unrevert, or a fork) does, path by path (a
    fork's paths are restored in its copy of the workspace). ``applied`` once
    the paths were restored and the event written."""

    session_id: str
    message_id: str
    kind: Literal["revert", "unrevert", "fork"] = "revert"
    paths: tuple[RevertPath, ...] = ()
    # A revert hides the messages from this seq on (the first message after ``message_id``).
    boundary_seq: int | None = None
    applied: bool = False
    # Why nothing was done at all (busy, no such message, nothing to unrevert).
    refused: str | None = None
    # A fork's new session and its workspace, and the protected paths and special files
    # (sockets, pipes, devices) its copy left out.
    fork_session_id: str | None = None
    directory: str | None = None
    left_out: tuple[str, ...] = ()

    @property
    def refusals(self) -> tuple[RevertPath, ...]:
        return tuple(p for p in self.paths if p.refused is not None)


def hidden_range(settings: dict[str, object] | None) -> tuple[int, int] | None:
    """The seqs [from, to) of the messages a staged revert hides, from the session's settings
    (None: nothing hidden)."""
    revert = (settings or {}).get("revert")
    if not isinstance(revert, dict):
        return None
    start, end = revert.get("boundary_seq"), revert.get("seq")
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    return start, end


M = TypeVar("M", bound=HasSeq)


def visible(messages: list[M], settings: dict[str, object] | None) -> list[M]:
    """``messages`` without those a staged revert hides."""
    hidden = hidden_range(settings)
    if hidden is None:
        return messages
    start, end = hidden
    return [m for m in messages if not start <= m.seq < end]
