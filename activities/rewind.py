"""Rewind: a session's conversation and workspace put back together (DESIGN "Children,
hosts, spend, rewind").

A revert to message M restores every path the calls after M changed to what it held before
the first of them, as the journal says (``activities/journal.py``), and hides the messages
after M. Path by path, it first checks that the path still holds what the session last left
there: a path someone changed since is refused (``force`` restores it anyway), and so is one
whose earlier content the journal does not have (the shell changed a file the session never
read through a tool, or it was over the content cap: ``force`` leaves it as it is). Any
refusal changes nothing at all. An unrevert puts back what the last revert replaced, while no
prompt came after it.

``revert_workspace`` runs on the host of the session's workspace, under the claim of a busy
period of its own (so no turn runs meanwhile), and writes ``session.reverted`` (or
``session.unreverted``) last: a worker killed in the middle leaves each path old or new
(``journal.restore`` renames), and the activity's retry plans again from the journal, finds
the paths already restored, and finishes. A dry run plans on the host without a claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temporalio import activity

from activities import context, journal
from activities.runtime import Runtime, heartbeating, own, translated
from activities.tool_run import not_this_host
from activities.tools.paths import Workspace
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev
from sessionflow.models.drain import RevertInput, RevertRequest
from sessionflow.models.journal import (
    FileState,
    RevertPath,
    RevertPlan,
    RevertRefusal,
    hidden_range,
    visible,
)
from sessionflow.models.messages import Message
from store import Store
from store.sessions import SessionInfo

_DIFF_BYTES = 256 * 1024  # a dry run's line counts cover text files up to this size


@dataclass(frozen=True)
class JournalEntry:
    """One journal entry: a call's change of a path, or a revert's (or unrevert's)."""

    position: int
    path: str
    before: FileState | None
    after: FileState | None
    message_id: str | None  # the call's message; None for a revert's own entry


@dataclass(frozen=True)
class Goal:
    """What a path must go back ``to``, and what it must hold now (``expected``) for that
    to be safe."""

    path: str
    to: FileState | None
    expected: FileState | None
    unknown: bool = False  # ``to`` is a content the journal never had


async def read_journal(store: Store, session_id: str) -> tuple[list[JournalEntry], list[Any]]:
    """Every entry of the session's journal in log order, and its revert events."""
    kinds: list[type[ev.Event]] = [ev.FilesChanged, ev.SessionReverted, ev.SessionUnreverted]
    entries: list[JournalEntry] = []
    reverts: list[Any] = []
    for stored in await store.events.all_of(session_id, kinds):
        data = stored.data
        if isinstance(data, ev.FilesChanged):
            for change in data.changes:
                entries.append(
                    JournalEntry(
                        len(entries),
                        change.path,
                        change.before,
                        change.after,
                        data.assistant_message_id,
                    )
                )
        elif isinstance(data, ev.SessionReverted | ev.SessionUnreverted):
            reverts.append(stored)
            for path in data.paths:
                entries.append(JournalEntry(len(entries), path.path, path.was, path.to, None))
    return entries, reverts


def _latest(entries: list[JournalEntry], path: str) -> FileState | None:
    """What the session last left at ``path``."""
    last = [e for e in entries if e.path == path]
    return last[-1].after if last else None


def _known(entries: list[JournalEntry], entry: JournalEntry) -> FileState | None:
    """``entry``'s content before, with a content: the shell saw only metadata, which an
    earlier entry's "after" names when nothing rewrote the file between them."""
    before = entry.before
    if before is None or before.kind == "symlink" or before.digest is not None:
        return before
    for earlier in reversed(entries[: entry.position]):
        if earlier.path == entry.path:
            after = earlier.after
            if after is not None and after.digest is not None and after.same_file(before):
                return after
            return None  # the file changed in between, unseen
    return None


def revert_goals(entries: list[JournalEntry], hidden: set[str]) -> list[Goal]:
    """Each path the calls of the ``hidden`` messages changed, back to before the first."""
    goals: list[Goal] = []
    for path in sorted({e.path for e in entries if e.message_id in hidden}):
        first = next(e for e in entries if e.path == path and e.message_id in hidden)
        to = _known(entries, first)
        unknown = first.before is not None and to is None
        goals.append(Goal(path, to, _latest(entries, path), unknown))
    return goals


def unrevert_goals(entries: list[JournalEntry], reverted: ev.SessionReverted) -> list[Goal]:
    return [Goal(p.path, p.was, _latest(entries, p.path)) for p in reverted.paths]


def _same(one: FileState | None, other: FileState | None) -> bool:
    if one is None or other is None:
        return one is other
    return one.same_content(other)


def decide(goal: Goal, now: FileState | None, kept: bool, forced: bool) -> RevertPath:
    """One path of the plan: ``now`` is what it holds, ``kept`` whether the content to
    restore is in the blob table, ``forced`` whether the caller overrides a refusal."""
    to, expected = goal.to, goal.expected
    base = RevertPath(path=goal.path, action="unchanged", now=now, to=to, expected=expected)
    if goal.unknown:
        why = "its content before the session changed it was never read (changed by the shell)"
        return _refused(base, "unknown-before", why, forced)
    if _same(now, to):
        return base  # already as it was (or a retry that restored it)
    if to is not None and to.kind == "file" and not kept:
        why = "its earlier content was over the journal's content cap, and was not kept"
        return _refused(base, "content-not-kept", why, forced)
    change = base.model_copy(update={"action": "delete" if to is None else "restore"})
    if _same(now, expected):
        return change
    if forced:
        return change.model_copy(update={"forced": True})
    why = "it changed since the session last wrote it (someone else edited it)"
    return change.model_copy(update={"refused": "changed-since", "reason": why})


def _refused(base: RevertPath, refusal: RevertRefusal, why: str, forced: bool) -> RevertPath:
    if forced:  # left as it is
        return base.model_copy(update={"to": base.now, "forced": True, "reason": why})
    return base.model_copy(update={"refused": refusal, "reason": why})


def was(path: RevertPath) -> FileState | None:
    """What an unrevert gives the path back: what the session had left there, or for a
    forced path what was there instead."""
    return path.now if path.forced else path.expected


class RewindActivities:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    @activity.defn
    async def revert_workspace(self, request: RevertInput) -> RevertPlan:
        """Plan the revert (or unrevert) on this host; unless a dry run or refused, restore
        its paths, then record it under the claim."""
        store, asked = self.rt.store, request.request
        beating = heartbeating(store, request.claim) if request.claim else contextlib.nullcontext()
        async with translated(), beating:
            session = await store.sessions.get(request.session_id)
            if not self.rt.runs_tools_of(session):
                raise not_this_host(self.rt.host, session.host)
            entries, reverts = await read_journal(store, session.id)
            plan, goals = await self._goals(session, asked, entries, reverts)
            if plan.refused is not None:
                return plan
            plan, contents = await self._planned(session, asked, plan, goals)
            if asked.dry_run or plan.refusals or request.claim is None:
                return plan
            # What a forced path held instead is kept first: an unrevert gives it back.
            await store.blobs.put_many(
                c for p in plan.paths if p.forced and (c := contents.get(p.path)) is not None
            )
            restored = await self._restored(plan)
            settings = context.tool_settings(self.rt.tools)
            await asyncio.to_thread(apply_all, session.directory, settings, plan, restored)
            claim = await own(store, request.claim)
            event = _event(session.id, asked, plan)
            event_id = f"evt_{asked.request_id}_{asked.kind}"
            await store.claims.run_fenced(
                claim, lambda tx: store.events.publish(event, id=event_id, tx=tx)
            )
            return plan.model_copy(update={"applied": True})

    async def _goals(
        self,
        session: SessionInfo,
        request: RevertRequest,
        entries: list[JournalEntry],
        reverts: list[Any],
    ) -> tuple[RevertPlan, list[Goal]]:
        staged = hidden_range(session.settings)
        base = RevertPlan(
            session_id=session.id, message_id=request.message_id or "", kind=request.kind
        )
        if request.kind == "unrevert":
            revert = session.settings.get("revert")
            at = revert.get("seq") if isinstance(revert, dict) else None
            last = next((r.data for r in reverts if r.seq == at), None)
            if staged is None or not isinstance(last, ev.SessionReverted):
                why = (
                    "nothing to unrevert: no revert is staged (a prompt after a revert makes "
                    "it permanent)"
                )
                return base.model_copy(update={"refused": why}), []
            base = base.model_copy(update={"message_id": last.message_id})
            return base, unrevert_goals(entries, last)
        split = await self.split(session, request.message_id or "")
        if isinstance(split, str):
            return base.model_copy(update={"refused": split}), []
        _kept, later = split
        if not later:
            why = f"nothing comes after message {request.message_id}: there is nothing to revert"
            return base.model_copy(update={"refused": why}), []
        base = base.model_copy(update={"boundary_seq": later[0].seq})
        return base, revert_goals(entries, {m.id for m in later})

    async def split(
        self, session: SessionInfo, message_id: str
    ) -> tuple[list[Message], list[Message]] | str:
        """The shown history up to ``message_id`` and the shown messages after it (a staged
        revert already undid the changes of those it hides), or why there is no such split."""
        messages = await self.rt.store.sessions.messages(session.id)
        target = next((m for m in messages if m.id == message_id), None)
        if target is None:
            return f"no message {message_id!r} in session {session.id}"
        staged = hidden_range(session.settings)
        if staged is not None and staged[0] <= target.seq < staged[1]:
            return f"message {target.id} is hidden by the last revert: unrevert first"
        shown = visible(messages, session.settings)
        return [m for m in shown if m.seq <= target.seq], [m for m in shown if m.seq > target.seq]

    async def _planned(
        self,
        session: SessionInfo,
        request: RevertRequest,
        plan: RevertPlan,
        goals: list[Goal],
        *,
        seen: Callable[[RevertPath], RevertPath] = lambda path: path,
    ) -> tuple[RevertPlan, dict[str, bytes]]:
        """``plan`` with its paths decided against the workspace as it is now (each passed
        through ``seen``), with a diff summary for a dry run, and what they hold (within the
        cap)."""
        settings = context.tool_settings(self.rt.tools)
        kept = {g.path: await self._kept(g.to) for g in goals if g.to is not None}
        decided, contents = await asyncio.to_thread(
            _decide_all, session.directory, settings, goals, kept, set(request.force)
        )
        paths = [seen(p) for p in decided]
        if request.dry_run:
            paths = [await self._with_diff(p, contents.get(p.path)) for p in paths]
        return plan.model_copy(update={"paths": tuple(paths)}), contents

    async def _restored(self, plan: RevertPlan) -> dict[str, bytes | None]:
        return {p.path: await self._content(p.to) for p in plan.paths if p.action == "restore"}

    async def _kept(self, state: FileState) -> bool:
        if state.kind == "symlink":
            return True
        return bool(state.digest and state.stored) and await self._content(state) is not None

    async def _content(self, state: FileState | None) -> bytes | None:
        if state is None or state.kind != "file" or not state.digest:
            return None
        return await self.rt.store.blobs.get(state.digest)

    async def _with_diff(self, path: RevertPath, now: bytes | None) -> RevertPath:
        """Lines added and removed by the restore, for a text file (the dry run's summary)."""
        if path.action == "unchanged":
            return path
        old = now if now is not None or path.now is None else None
        new = await self._content(path.to) if path.action == "restore" else b""
        if old is None and path.now is None:
            old = b""
        if old is None or new is None or max(len(old), len(new)) > _DIFF_BYTES:
            return path
        added, removed = line_counts(old, new)
        return path.model_copy(update={"added": added, "removed": removed})


def event_paths(plan: RevertPlan) -> tuple[ev.RevertedPath, ...]:
    """The paths ``plan`` gave back, as its event records them."""
    return tuple(
        ev.RevertedPath(path=p.path, was=was(p), to=p.to)
        for p in plan.paths
        if not (p.forced and p.action == "unchanged")
    )


def _event(session_id: str, request: RevertRequest, plan: RevertPlan) -> ev.Event:
    paths = event_paths(plan)
    forced = tuple(p.path for p in plan.paths if p.forced)
    if request.kind == "unrevert":
        return ev.SessionUnreverted(
            session_id=session_id, message_id=plan.message_id, paths=paths, forced=forced
        )
    assert plan.boundary_seq is not None
    return ev.SessionReverted(
        session_id=session_id,
        message_id=plan.message_id,
        boundary_seq=plan.boundary_seq,
        paths=paths,
        forced=forced,
    )


def _decide_all(
    root: str,
    settings: ToolSettings,
    goals: list[Goal],
    kept: dict[str, bool],
    force: set[str],
) -> tuple[list[RevertPath], dict[str, bytes]]:
    """The plan's paths as the workspace holds them now, and their contents (within the cap)."""
    decided: list[RevertPath] = []
    contents: dict[str, bytes] = {}
    with Workspace(root, settings) as workspace:
        for goal in goals:
            try:
                now = journal.read_state(workspace, goal.path, settings.journal_max_bytes)
            except (journal.Unjournaled, OSError) as why:
                unsafe = RevertPath(
                    path=goal.path,
                    action="unchanged",
                    to=goal.to,
                    refused="unsafe-path",
                    reason=str(why),
                )
                decided.append(unsafe)
                continue
            if now.content is not None:
                contents[goal.path] = now.content
            decided.append(decide(goal, now.state, kept.get(goal.path, False), goal.path in force))
    return decided, contents


def apply_all(
    root: str, settings: ToolSettings, plan: RevertPlan, contents: dict[str, bytes | None]
) -> None:
    with Workspace(root, settings) as workspace:
        for path in plan.paths:
            if path.action != "unchanged":
                journal.restore(workspace, path.path, path.to, contents.get(path.path))


def line_counts(old: bytes, new: bytes) -> tuple[int, int]:
    """(added, removed) lines from ``old`` to ``new``."""
    before = old.decode(errors="replace").splitlines()
    after = new.decode(errors="replace").splitlines()
    added = removed = 0
    for line in difflib.unified_diff(before, after, lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed
