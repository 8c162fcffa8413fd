"""Fork: a new session from another's history up to a message, in a copy of its workspace as
it was then (issue 31; reference §8.3 "Fork").

``fork_workspace`` runs on the workspace's host, in a busy period of the source (as a revert
does). The copy is made beside the directory the caller named, under a name of its own per
attempt (``.<name>.fork-<session>-<attempt>``): the source's files with their modes and
times, links as links, without its protected paths and special files. The paths the source's
later calls changed are put back in the copy as a revert would put them back (``rewind``):
what a person changed since is not part of the state at that message, so it is not a refusal
here, but a content the journal never had still is (``force`` leaves the path as it is now).

One transaction under the source's claim writes the fork's log (``session.created``, its
messages as ``session.message.copied``, its calls' journal and what the copy holds of those
paths) and the source's ``session.forked``, and renames the copy into place before it
commits: a fork is made whole or not at all. A retried attempt that finds ``session.forked``
answers from it; one that finds an earlier attempt's copy removes it and copies again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import activity

from activities import context, journal
from activities.hosts import instructions
from activities.rewind import RewindActivities, apply_all, event_paths, read_journal, revert_goals
from activities.runtime import heartbeating, own, translated
from activities.tool_run import not_this_host
from activities.tools.paths import Protected
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev
from sessionflow.models.drain import LOCAL_HOST, ClaimRef, RevertInput, RevertRequest
from sessionflow.models.journal import FileChange, RevertPath, RevertPlan
from sessionflow.models.messages import AssistantMessage, CompactionMessage, Message
from store.db import Tx
from store.sessions import SessionInfo

# What a fork does not carry over: the source's staged revert (the fork's history already
# ends where it should), what was read from the source's workspace (the baseline is rebuilt
# from the copy at the fork's first turn, as after a move), and its place in a task tree (a
# fork is a root session).
_NOT_COPIED = ("revert", "observed", "task")
_FORK_TITLE = re.compile(r"^(.*) \(fork #(\d+)\)$")


def staging(directory: str, fork_id: str, attempt: int) -> str:
    """Where an attempt makes the copy before it is renamed to ``directory`` (the same
    filesystem)."""
    parent, name = os.path.split(directory)
    return os.path.join(parent, f".{name}.fork-{fork_id}-{attempt}")


def clear_stale(directory: str, fork_id: str, attempt: int) -> None:
    """Remove the copies earlier attempts of this fork left (they died before their commit)."""
    for n in range(1, attempt):
        shutil.rmtree(staging(directory, fork_id, n), ignore_errors=True)


def where_refused(source: str, directory: str) -> str | None:
    """Why ``directory`` cannot take a fork of the workspace ``source`` (None: it can)."""
    if not os.path.isabs(directory):
        return f"the fork's workspace {directory} must be an absolute path"
    if os.path.normpath(directory) != directory:
        return f"the fork's workspace {directory} must be a plain path, without '.' or '..'"
    target, root = os.path.realpath(directory), os.path.realpath(source)
    if os.path.commonpath([target, root]) in (target, root):
        return (
            f"the fork's workspace {directory} must be outside the session's workspace "
            f"{source}, and not contain it"
        )
    if os.path.lexists(directory):
        return f"the fork's workspace {directory} already exists: name a new directory"
    if not os.path.isdir(os.path.dirname(directory)):
        return f"the fork's workspace {directory} has no parent directory: create it first"
    return None


def copy_workspace(
    source: str, to: str, settings: ToolSettings, *, becomes: str | None = None
) -> list[str]:
    """Copy ``source`` to ``to`` (which must not exist) but its protected paths and special
    files, which it returns. A link that names a path inside ``source`` absolutely names the
    same path inside ``becomes`` (the copy's final place) instead: the fork reads its own."""
    roots = [source, os.path.realpath(source)]
    protected = Protected.for_root(settings, roots)
    left_out: list[str] = []
    relinked: dict[str, str] = {}

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
            elif stat.S_ISLNK(mode) and becomes is not None:
                target = _inside(os.readlink(os.path.join(directory, name)), roots, becomes)
                if target is not None:
                    relinked["/".join(parts)] = target
        return skip

    shutil.copytree(source, to, symlinks=True, ignore=ignored)
    for rel, target in relinked.items():
        os.unlink(os.path.join(to, rel))
        os.symlink(target, os.path.join(to, rel))
    return sorted(left_out)


def _inside(target: str, roots: list[str], becomes: str) -> str | None:
    """``target`` moved from under one of ``roots`` to under ``becomes``, if it is under one."""
    if not os.path.isabs(target):
        return None
    for root in roots:
        if target == root or target.startswith(root.rstrip("/") + "/"):
            return becomes + target[len(root.rstrip("/")) :]
    return None


def put_in_place(staged: str, directory: str) -> None:
    """Rename the finished copy to the fork's workspace; a run of the same transaction
    before this one may have done it already."""
    if os.path.lexists(staged):
        if os.path.lexists(directory):
            raise FileExistsError(f"the fork's workspace {directory} appeared meanwhile")
        os.rename(staged, directory)
    elif not os.path.isdir(directory):
        raise FileNotFoundError(f"the fork's copy {staged} is gone")


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
    *,
    observed: dict[str, str] | None = None,
    max_bytes: int = 4 * 1024 * 1024,
) -> ForkLog:
    """The fork's log up to its first prompt: created (seq 0), its messages (seq 1, 2, ...,
    as ``publish_many`` gives a new session's batch; a message over half ``max_bytes`` is
    copied without its parts, each part then in an event of its own), then the journal of
    their calls (so a revert in the fork finds what they changed)."""
    settings = {k: v for k, v in source.settings.items() if k not in _NOT_COPIED}
    settings["baseline"] = None  # None, not absent: rebuilt at the first turn
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
    events: list[ev.Event] = [created]
    ids = {m.id: _message_id(fork_id, i) for i, m in enumerate(history)}
    seqs: dict[int, int] = {}
    for message in history:
        seqs[message.seq] = len(events)  # the seq its event gets
        events += _copied(message, fork_id, ids[message.id], len(events), max_bytes // 2)
    for event in events:
        copy = event.message if isinstance(event, ev.MessageCopied) else None
        if isinstance(copy, CompactionMessage) and copy.boundary_seq is not None:
            covered = [new for old, new in seqs.items() if old <= copy.boundary_seq]
            copy.boundary_seq = max(covered, default=0)
    for entry in journal:
        if entry.assistant_message_id in ids:
            update = {
                "session_id": fork_id,
                "assistant_message_id": ids[entry.assistant_message_id],
            }
            events.append(entry.model_copy(update=update))
    return ForkLog(events, ids)


def _copied(message: Message, fork_id: str, new_id: str, seq: int, limit: int) -> list[ev.Event]:
    copy = message.model_copy(deep=True, update={"id": new_id, "session_id": fork_id, "seq": seq})
    whole = ev.MessageCopied(session_id=fork_id, message=copy, from_message_id=message.id)
    if not isinstance(copy, AssistantMessage) or len(whole.model_dump_json()) <= limit:
        return [whole]
    parts, copy.content = copy.content, []
    head = ev.MessageCopied(session_id=fork_id, message=copy, from_message_id=message.id)
    return [
        head,
        *(ev.PartCopied(session_id=fork_id, assistant_message_id=new_id, part=p) for p in parts),
    ]


def _message_id(fork_id: str, index: int) -> str:
    digest = hashlib.sha256(f"{fork_id}/{index}".encode()).hexdigest()[:24]
    return f"msg_{digest}"


def fork_title(source: SessionInfo, forks: int) -> str:
    """The reference's "<title> (fork #N)": N above the source's own number (a fork of a
    fork) and above the forks made of it before."""
    title = source.title or source.id
    match = _FORK_TITLE.match(title)
    base, number = (match.group(1), int(match.group(2))) if match else (title, 0)
    return f"{base} (fork #{max(number, forks) + 1})"


def in_the_copy(path: RevertPath) -> RevertPath:
    """A revert's decision made a fork's: a path someone changed since the session last wrote
    it is put back all the same (the copy is the state at the message, nobody's work)."""
    if path.refused != "changed-since":
        return path
    return path.model_copy(update={"refused": None, "reason": None})


def as_copied(
    fork_id: str, message_id: str, seen: dict[str, journal.Seen]
) -> ev.FilesChanged | None:
    """The journaled paths as the copy holds them (same content, the copy's own inodes):
    the entry a later shell change in the fork matches its "before" against."""
    changes = tuple(
        FileChange(path=path, before=s.state, after=s.state)
        for path, s in sorted(seen.items())
        if s.state is not None
    )
    if not changes:
        return None
    return ev.FilesChanged(
        session_id=fork_id, assistant_message_id=message_id, call_id="fork", changes=changes
    )


class ForkActivities(RewindActivities):
    @activity.defn
    async def fork_workspace(self, request: RevertInput) -> RevertPlan:
        """Plan the fork on this host; unless a dry run or refused, copy the workspace with
        the plan's paths put back, and make the fork (``_make``)."""
        store, asked = self.rt.store, request.request
        assert asked.fork_session_id is not None and asked.directory is not None
        beating = heartbeating(store, request.claim) if request.claim else contextlib.nullcontext()
        async with translated(), beating:
            session = await store.sessions.get(request.session_id)
            if not self.rt.runs_tools_of(session):
                raise not_this_host(self.rt.host, session.host)
            base = RevertPlan(
                session_id=session.id,
                message_id=asked.message_id or "",
                kind="fork",
                fork_session_id=asked.fork_session_id,
                directory=asked.directory,
            )
            made = await self._forked(session.id, asked.fork_session_id)
            if made is not None:  # a retry after the commit: the fork is whole
                return _done(base, made)
            split = await self.split(session, asked.message_id or "")
            refused = split if isinstance(split, str) else await self._where(session, asked)
            if refused is not None or isinstance(split, str):
                return base.model_copy(update={"refused": refused})
            history, later = split
            entries, _reverts = await read_journal(store, session.id)
            goals = revert_goals(entries, {m.id for m in later})
            plan, _ = await self._planned(session, asked, base, goals, seen=in_the_copy)
            if asked.dry_run or plan.refusals or request.claim is None:
                return plan
            return _done(plan, await self._make(session, asked, plan, history, request.claim))

    async def _where(self, session: SessionInfo, request: RevertRequest) -> str | None:
        assert request.fork_session_id is not None and request.directory is not None
        refused = await asyncio.to_thread(where_refused, session.directory, request.directory)
        if refused is None and await self.rt.store.sessions.exists(request.fork_session_id):
            refused = f"a session {request.fork_session_id} exists already: fork to a new id"
        return refused

    async def _make(
        self,
        session: SessionInfo,
        request: RevertRequest,
        plan: RevertPlan,
        history: list[Message],
        held: ClaimRef,
    ) -> ev.SessionForked:
        """The copy, then one fenced transaction: the fork's log, the source's
        ``session.forked`` and the copy's rename into place. A cancellation meanwhile waits
        for the transaction (it commits or not as a whole); a failure before it removes the
        copy."""
        assert request.fork_session_id is not None and request.directory is not None
        fork_id, directory = request.fork_session_id, request.directory
        staged = staging(directory, fork_id, activity.info().attempt)
        await asyncio.to_thread(clear_stale, directory, fork_id, activity.info().attempt)
        try:
            left_out, seen = await self._copy(session, plan, history, staged, directory)
            log = await self._log(session, request, history, staged, seen)
            forked = ev.SessionForked(
                session_id=session.id,
                message_id=plan.message_id,
                fork_session_id=fork_id,
                directory=directory,
                paths=event_paths(plan),
                left_out=tuple(left_out),
            )
            claim = await own(self.rt.store, held)

            async def write(tx: Tx) -> None:
                with tx.unstamped():
                    await self.rt.store.events.publish_many(log, tx=tx)
                await self.rt.store.events.publish(
                    forked, id=f"evt_{request.request_id}_fork", tx=tx
                )
                put_in_place(staged, directory)  # a failed commit leaves it: see the README

            made = asyncio.ensure_future(self.rt.store.claims.run_fenced(claim, write))
            try:
                await asyncio.shield(made)
            except asyncio.CancelledError:
                await made  # made or not, as a whole: then the cancellation is answered
            return forked
        finally:
            await asyncio.to_thread(shutil.rmtree, staged, True)  # gone once renamed

    async def _copy(
        self,
        session: SessionInfo,
        plan: RevertPlan,
        history: list[Message],
        staged: str,
        directory: str,
    ) -> tuple[list[str], dict[str, journal.Seen]]:
        """The copy with the plan's paths put back, and what it holds of the journaled paths."""
        settings = context.tool_settings(self.rt.tools)
        restored = await self._restored(plan)
        ids = {m.id for m in history}
        entries, _reverts = await read_journal(self.rt.store, session.id)
        paths = sorted({e.path for e in entries if e.message_id in ids})

        def copy() -> tuple[list[str], dict[str, journal.Seen]]:
            left_out = copy_workspace(session.directory, staged, settings, becomes=directory)
            apply_all(staged, settings, plan, restored)
            return left_out, journal.capture(staged, settings, paths)

        left_out, seen = await asyncio.to_thread(copy)
        await self.rt.store.blobs.put_many(s.content for s in seen.values() if s.content)
        return left_out, seen

    async def _log(
        self,
        session: SessionInfo,
        request: RevertRequest,
        history: list[Message],
        staged: str,
        seen: dict[str, journal.Seen],
    ) -> list[ev.Event]:
        store = self.rt.store
        assert request.fork_session_id is not None and request.directory is not None
        observed = None
        if session.host != LOCAL_HOST:  # turns on other hosts read them from the store
            observed = await asyncio.to_thread(instructions, staged, self.rt.tools)
        journaled = [
            e.data
            for e in await store.events.all_of(session.id, [ev.FilesChanged])
            if isinstance(e.data, ev.FilesChanged)
        ]
        title = fork_title(session, len(await store.events.all_of(session.id, [ev.SessionForked])))
        log = fork_log(
            session,
            request.fork_session_id,
            request.directory,
            title,
            history,
            journaled,
            observed=observed,
            max_bytes=store.events.max_event_bytes,
        )
        last = log.ids[history[-1].id]
        entry = as_copied(request.fork_session_id, last, seen)
        return [*log.events, entry] if entry is not None else log.events

    async def _forked(self, session_id: str, fork_id: str) -> ev.SessionForked | None:
        """The source's record of the fork ``fork_id``, once made (a retry after it)."""
        for stored in await self.rt.store.events.all_of(session_id, [ev.SessionForked]):
            if isinstance(stored.data, ev.SessionForked) and stored.data.fork_session_id == fork_id:
                return stored.data
        return None


def _done(plan: RevertPlan, made: ev.SessionForked) -> RevertPlan:
    """``plan`` made: its paths as ``session.forked`` recorded them (a retry answers so)."""
    paths = tuple(
        RevertPath(
            path=p.path, action="delete" if p.to is None else "restore", to=p.to, expected=p.was
        )
        for p in made.paths
    )
    return plan.model_copy(
        update={"applied": True, "left_out": made.left_out, "paths": plan.paths or paths}
    )
