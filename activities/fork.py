"""Fork: a new session from another's history up to a message, in a copy of its workspace as
it was then (issue 31; reference §8.3 "Fork").

The copy is made on the workspace's host, beside the directory the caller named, under a
name of its own (``.<name>.fork-<session>``): the source's files with their modes and times,
links as links, without its protected paths and special files. The paths the source's later
calls changed are then put back in the copy as a revert would put them back (``rewind``):
what a person changed since is not part of the state at that message, so it is not a
refusal here, but a content the journal never had still is (``force`` leaves the path as it
is now). The fork's log (``session.created``, one ``session.message.copied`` per message, its
journal) and the source's ``session.forked`` commit in one transaction under the source's
claim; the copy is renamed into place after it. A retried attempt that finds the fork's
session made only renames.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from activities.tools.paths import Protected
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev
from sessionflow.models.journal import RevertPath
from sessionflow.models.messages import CompactionMessage, Message
from store.sessions import SessionInfo

# What a fork does not carry over: the source's staged revert (the fork's history already
# ends where it should), and what was read from the source's workspace (rebuilt from the
# copy at the fork's first turn, as after a move).
_NOT_COPIED = ("revert", "observed", "baseline")
_FORK_TITLE = re.compile(r"^(.*) \(fork #\d+\)$")


def staging(directory: str, fork_id: str) -> str:
    """Where the copy is made before it is renamed to ``directory`` (the same filesystem)."""
    parent, name = os.path.split(directory.rstrip("/"))
    return os.path.join(parent, f".{name}.fork-{fork_id}")


def where_refused(source: str, directory: str) -> str | None:
    """Why ``directory`` cannot take a fork of the workspace ``source`` (None: it can)."""
    if not os.path.isabs(directory):
        return f"the fork's workspace {directory} must be an absolute path"
    target, root = os.path.realpath(directory), os.path.realpath(source)
    if os.path.commonpath([target, root]) in (target, root):
        return (
            f"the fork's workspace {directory} must be outside the session's workspace "
            f"{source}, and not contain it"
        )
    if os.path.lexists(directory):
        return f"the fork's workspace {directory} already exists: name a new directory"
    if not os.path.isdir(os.path.dirname(target)):
        return f"the fork's workspace {directory} has no parent directory: create it first"
    return None


def copy_workspace(source: str, to: str, settings: ToolSettings) -> list[str]:
    """Copy ``source`` to ``to`` (which must not exist) but its protected paths and special
    files, which it returns; a stale ``to`` of an earlier attempt is removed first."""
    if os.path.lexists(to):
        shutil.rmtree(to)
    protected = Protected.for_root(settings, [source])
    left_out: list[str] = []

    def ignored(directory: str, names: list[str]) -> set[str]:
        rel = os.path.relpath(directory, source)
        base = [] if rel == "." else rel.split(os.sep)
        skip = set()
        for name in names:
            parts = [*base, name]
            mode = os.lstat(os.path.join(directory, name)).st_mode
            plain = stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)
            if protected.match(parts) is not None or not plain:
                skip.add(name)
                left_out.append("/".join(parts))
        return skip

    shutil.copytree(source, to, symlinks=True, ignore=ignored)
    return sorted(left_out)


def put_in_place(staged: str, directory: str) -> None:
    """Rename the finished copy to the fork's workspace (done already: nothing to do)."""
    if os.path.lexists(staged) and not os.path.lexists(directory):
        os.rename(staged, directory)


@dataclass(frozen=True)
class ForkLog:
    """The fork's first events, and the message ids it gave the copies (source -> fork)."""

    events: list[ev.Event]
    ids: dict[str, str]


def fork_log(
    source: SessionInfo,
    fork_id: str,
    directory: str,
    title: str,
    history: Sequence[Message],
    journal: Sequence[ev.FilesChanged],
    observed: dict[str, str] | None,
) -> ForkLog:
    """The fork's log up to its first prompt: created (seq 0), its messages (seq 1, 2, ...,
    as ``publish_many`` gives a new session's batch), then the journal of their calls (so a
    revert in the fork finds what they changed)."""
    settings = {k: v for k, v in source.settings.items() if k not in _NOT_COPIED}
    settings["fork"] = {"session_id": source.id, "message_id": history[-1].id}
    created = ev.SessionCreated(
        session_id=fork_id,
        directory=directory,
        title=title,
        model=source.model,
        agent=source.agent,
        workspace_id=source.workspace_id,
        settings=settings,
        host=None if source.host == "local" else source.host,
        observed=observed,
        requests=source.requests,
    )
    ids = {m.id: _message_id(fork_id, i) for i, m in enumerate(history)}
    seqs = {m.seq: i + 1 for i, m in enumerate(history)}
    events: list[ev.Event] = [created]
    for message in history:
        copy = message.model_copy(
            deep=True,
            update={"id": ids[message.id], "session_id": fork_id, "seq": seqs[message.seq]},
        )
        if isinstance(copy, CompactionMessage) and copy.boundary_seq is not None:
            covered = [new for old, new in seqs.items() if old <= copy.boundary_seq]
            copy.boundary_seq = max(covered, default=0)
        events.append(
            ev.MessageCopied(session_id=fork_id, message=copy, from_message_id=message.id)
        )
    for entry in journal:
        if entry.assistant_message_id in ids:
            events.append(
                entry.model_copy(
                    update={
                        "session_id": fork_id,
                        "assistant_message_id": ids[entry.assistant_message_id],
                    }
                )
            )
    return ForkLog(events, ids)


def _message_id(fork_id: str, index: int) -> str:
    digest = hashlib.sha256(f"{fork_id}/{index}".encode()).hexdigest()[:24]
    return f"msg_{digest}"


def fork_title(source: SessionInfo, forks: int) -> str:
    """The reference's "<title> (fork #N)", N counting the source's forks."""
    title = source.title or source.id
    match = _FORK_TITLE.match(title)
    return f"{match.group(1) if match else title} (fork #{forks + 1})"


def in_the_copy(path: RevertPath) -> RevertPath:
    """A revert's decision made a fork's: a path someone changed since the session last wrote
    it is put back all the same (the copy is the state at the message, nobody's work)."""
    if path.refused != "changed-since":
        return path
    return path.model_copy(update={"refused": None, "reason": None})
