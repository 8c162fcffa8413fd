"""The context baseline (reference §1.6, §8.4): the system context, frozen per session.

Sources: the workspace's instruction file (``AGENTS.md``, else ``CLAUDE.md``, at the workspace
root, read through the tools' confinement and protected-path rules, so a link pointing outside
is not read) and the context entries set through the API. On the first step they are rendered
into the baseline, which then never changes mid-session (so the provider's prompt cache keeps
hitting); a later change becomes a chronological system message. After a compaction the
baseline is rebuilt at the compaction point.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from activities.tools.base import ToolRegistry
from activities.tools.paths import Workspace
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev

INSTRUCTION_FILES = ("AGENTS.md", "CLAUDE.md")
MAX_INSTRUCTION_BYTES = 256 * 1024


def tool_settings(tools: ToolRegistry) -> ToolSettings:
    """The confinement the tools apply (the read tool's), for reading instruction files."""
    read = tools.get("read")
    settings = getattr(read, "settings", None)
    return settings if isinstance(settings, ToolSettings) else ToolSettings()


class Unobservable(Exception):
    """The sources cannot be seen right now (the workspace is gone or unreadable): that is no
    news about them, so nothing is removed or announced."""


def instruction_file(workspace: str, settings: ToolSettings) -> tuple[str, str] | None:
    """(name, text) of the first instruction file the workspace has, read confined."""
    if not Path(workspace).is_dir():
        raise Unobservable("the workspace is not a directory")
    try:
        root_context = Workspace(workspace, settings)
    except OSError as error:
        raise Unobservable(f"the workspace cannot be opened: {error.strerror or error}") from error
    with root_context as root:
        for name in INSTRUCTION_FILES:
            try:
                opened = root.open_file(name)
            except Exception:
                continue  # absent, protected, a link out: not a source
            try:
                data = os.read(opened.fd, MAX_INSTRUCTION_BYTES)
            finally:
                os.close(opened.fd)
            return name, data.decode("utf-8", "replace")
    return None


def sources(workspace: str, entries: dict[str, str], settings: ToolSettings) -> dict[str, str]:
    """Every source of the system context now: key -> text. ``Unobservable`` when the
    workspace cannot be seen."""
    found: dict[str, str] = {}
    file = instruction_file(workspace, settings)
    if file is not None:
        found[file[0]] = file[1]
    found.update({f"context:{key}": text for key, text in sorted(entries.items())})
    return found


def observed_sources(observed: object, entries: dict[str, str]) -> dict[str, str]:
    """``sources`` as the workspace's host last read them (``session.workspace.observed``)."""
    if not isinstance(observed, dict):
        raise Unobservable("its host has not read the workspace yet")
    found = {key: text for key, text in observed.items() if isinstance(text, str)}
    found.update({f"context:{key}": text for key, text in sorted(entries.items())})
    return found


def render(snapshot: dict[str, str]) -> str:
    blocks = []
    for key, text in snapshot.items():
        if key.startswith("context:"):
            blocks.append(f'<context key="{key.removeprefix("context:")}">\n{text}\n</context>')
        else:
            blocks.append(f'<instructions source="{key}">\n{text}\n</instructions>')
    return "\n\n".join(blocks)


def changes(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """The chronological system messages that tell the model how its context changed."""
    texts = []
    for key in before:
        if key not in now:
            texts.append(_removed(key))
    for key, text in now.items():
        if key not in before:
            texts.append(f'New context under "{_name(key)}" applies:\n{render({key: text})}')
        elif before[key] != text:
            texts.append(
                f'The context under "{_name(key)}" changed and supersedes the previous value:\n'
                + render({key: text})
            )
    return texts


def _name(key: str) -> str:
    return key.removeprefix("context:")


def _removed(key: str) -> str:
    if key.startswith("context:"):
        return f'The context under "{_name(key)}" no longer applies. Disregard it.'
    return f"System context source removed: {key}"


def _readable(snapshot: object) -> bool:
    return isinstance(snapshot, dict) and all(
        isinstance(key, str) and isinstance(text, str) for key, text in snapshot.items()
    )


def reconcile(
    session_id: str, settings: dict[str, Any], now: dict[str, str] | None, *, first: bool
) -> tuple[str, list[ev.Event]]:
    """The baseline the request uses, and the events that record what changed.

    The session's first request freezes the baseline, and a compaction (which leaves
    ``baseline`` None) has it rebuilt; until a source exists nothing is stored, and a source
    that appears later arrives as a system message, like any other change. ``now`` is None
    while the sources cannot be observed: a frozen baseline is kept as it is (runner #21), one
    to rebuild is rebuilt from the sources as last applied (#31), and a first request cannot
    be built (``Unobservable``; #4).
    """
    stored = settings.get("baseline", {} if "baseline" not in settings else None)
    if stored is not None and not isinstance(stored, dict):
        stored = {"baseline": "", "snapshot": None}  # undecodable: healed below
    if now is None:
        if isinstance(stored, dict) and stored:
            return str(stored.get("baseline") or ""), []
        applied = settings.get("applied")
        if stored is None and isinstance(applied, dict):
            event = ev.ContextBaselined(
                session_id=session_id, baseline=render(applied), snapshot=applied
            )
            return event.baseline, [event]
        if first:
            raise Unobservable("its sources cannot be read")
        return "", []
    if stored == {} and (not now or not first):
        stored = {"baseline": "", "snapshot": {}}  # never frozen: the baseline is empty
    if stored is None or stored == {}:
        event = ev.ContextBaselined(session_id=session_id, baseline=render(now), snapshot=now)
        return event.baseline, [event]
    baseline = stored.get("baseline")
    if not isinstance(baseline, str):
        baseline = ""
    before = stored.get("snapshot") or {}
    if not _readable(before):
        # The record of what was applied cannot be decoded: announce the context as it is now
        # and record it again (runner #7), rather than guess what the model already knows.
        texts = [f"The system context, announced again:\n{render(now)}"] if now else []
    else:
        if before == now:
            return baseline, []
        texts = changes(before, now)
    updates: list[ev.Event] = [
        ev.InstructionsUpdated(session_id=session_id, text=text) for text in texts
    ]
    updates.append(ev.ContextBaselined(session_id=session_id, baseline=baseline, snapshot=now))
    return baseline, updates
