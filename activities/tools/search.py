"""``list``, ``glob`` and ``grep``: walks of the workspace (``walk.py``) that skip protected paths
without descending into them, never follow links, and stop at a budget they report."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.files import looks_binary
from activities.tools.output import normalize, text_output
from activities.tools.paths import READ_FLAGS, Opened, Workspace
from activities.tools.patterns import Glob
from activities.tools.settings import ToolSettings
from activities.tools.walk import Entry, Walk

T = TypeVar("T")
_GREP_LINE_CHARS = 300


async def in_thread(work: Callable[[threading.Event], T]) -> T:
    """Run a walk in a thread; cancelling the caller asks the walk to stop."""
    stop = threading.Event()
    try:
        return await asyncio.to_thread(work, stop)
    finally:
        stop.set()


def _walk(
    workspace: Workspace, start: Opened, depth: int, s: ToolSettings, stop: threading.Event
) -> Walk:
    return Walk(workspace, start, max_depth=depth, budget=s.scan_entries, stop=stop)


def _footer(walk: Walk, shown: int, cap_hit: bool, cap: int) -> str:
    notes = []
    if cap_hit:
        notes.append(f"results capped at {cap}")
    if walk.truncated:
        notes.append(f"scan stopped after {walk.visited} entries; narrow the path")
    return f"\n[{shown} shown; {'; '.join(notes)}]" if notes else ""


class ListInput(BaseModel):
    path: str = Field(default=".", description="Directory, relative to the workspace root")
    depth: int = Field(default=1, ge=1, le=10, description="How many levels to descend")


class ListTool(Tool[ListInput]):
    name = "list"
    description = (
        "List a directory of the workspace: paths relative to the workspace root, directories "
        "ending in '/', symbolic links in '@'."
    )
    input_model = ListInput
    retry_safe = True

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: ListInput, context: ToolContext) -> ToolOutput:
        return await in_thread(lambda stop: self._list(input, str(context.workspace), stop))

    def _list(self, input: ListInput, root: str, stop: threading.Event) -> ToolOutput:
        cap = self.settings.list_entries
        with Workspace(root, self.settings) as workspace:
            start = workspace.open_dir(input.path)
            try:
                walk = _walk(workspace, start, input.depth, self.settings, stop)
                lines = [_listed(entry) for entry, _ in zip(walk, range(cap + 1), strict=False)]
            finally:
                os.close(start.fd)
        cap_hit = len(lines) > cap
        body = "\n".join(lines[:cap]) or "(empty directory)"
        return text_output(
            body,
            self.settings.output_cap,
            suffix=_footer(walk, min(len(lines), cap), cap_hit, cap),
            path=start.rel,
            entries=min(len(lines), cap),
            truncated=cap_hit or walk.truncated,
        )


def _listed(entry: Entry) -> str:
    return entry.rel + {"dir": "/", "link": "@"}.get(entry.kind, "")


class GlobInput(BaseModel):
    pattern: str = Field(min_length=1, description='Glob such as "**/*.py" or "src/*.{ts,tsx}"')
    path: str = Field(default=".", description="Directory the pattern is relative to")


class GlobTool(Tool[GlobInput]):
    name = "glob"
    description = (
        "Find files of the workspace by glob pattern ('*' within a name, '**' across "
        "directories, '{a,b}' alternatives). Returns paths relative to the workspace root."
    )
    input_model = GlobInput
    retry_safe = True

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: GlobInput, context: ToolContext) -> ToolOutput:
        return await in_thread(lambda stop: self._glob(input, str(context.workspace), stop))

    def _glob(self, input: GlobInput, root: str, stop: threading.Event) -> ToolOutput:
        glob = _relative_glob(input.pattern, anchored=True)
        cap = self.settings.glob_results
        depth = glob.depth() or self.settings.max_depth
        found: list[str] = []
        with Workspace(root, self.settings) as workspace:
            start = workspace.open_dir(input.path)
            try:
                walk = _walk(workspace, start, depth, self.settings, stop)
                for entry in walk:
                    if entry.kind != "dir" and glob.matches(walk.relative(entry)):
                        found.append(entry.rel)
                        if len(found) > cap:
                            break
            finally:
                os.close(start.fd)
        cap_hit = len(found) > cap
        body = "\n".join(found[:cap]) or f"No files match {input.pattern!r}"
        return text_output(
            body,
            self.settings.output_cap,
            suffix=_footer(walk, min(len(found), cap), cap_hit, cap),
            count=min(len(found), cap),
            truncated=cap_hit or walk.truncated,
        )


def _relative_glob(pattern: str, *, anchored: bool) -> Glob:
    if "\0" in pattern or pattern.startswith("/") or ".." in pattern.split("/"):
        raise ToolFailure(f"Pattern {pattern!r} must be relative and must not contain '..' or NUL")
    return Glob(pattern, anchored=anchored)


class GrepInput(BaseModel):
    pattern: str = Field(min_length=1, description="Python regular expression, matched per line")
    path: str = Field(default=".", description="File or directory to search")
    include: list[str] = Field(
        default_factory=list, description='Only files matching one of these globs, e.g. "*.py"'
    )
    ignore_case: bool = False


@dataclass
class _Hits:
    cap: int
    lines: list[str] = field(default_factory=list)
    skipped: int = 0

    @property
    def full(self) -> bool:
        return len(self.lines) >= self.cap


class Grep(Tool[GrepInput]):
    name = "grep"
    description = (
        "Search file contents of the workspace with a regular expression. Returns "
        "path:line: text. Binary, oversized and hard-linked files are skipped."
    )
    input_model = GrepInput
    retry_safe = True

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: GrepInput, context: ToolContext) -> ToolOutput:
        return await in_thread(lambda stop: self._grep(input, str(context.workspace), stop))

    def _grep(self, input: GrepInput, root: str, stop: threading.Event) -> ToolOutput:
        regex = _compile(input.pattern, input.ignore_case)
        includes = [_relative_glob(pattern, anchored=False) for pattern in input.include]
        hits = _Hits(self.settings.grep_matches)
        walk: Walk | None = None
        with Workspace(root, self.settings) as workspace:
            start = workspace.open(
                input.path, lambda fd, name: os.open(name, READ_FLAGS, dir_fd=fd)
            )
            try:
                if stat.S_ISDIR(start.st.st_mode):
                    walk = _walk(workspace, start, self.settings.max_depth, self.settings, stop)
                    self._search_tree(walk, regex, includes, hits)
                else:
                    workspace.check_file(input.path, start)
                    self._search_fd(start.fd, start.rel, regex, hits)
            finally:
                os.close(start.fd)
        return self._render(input, hits, walk)

    def _search_tree(
        self, walk: Walk, regex: re.Pattern[str], includes: list[Glob], hits: _Hits
    ) -> None:
        for entry in walk:
            if hits.full:
                return
            if entry.kind != "file":
                continue
            if includes and not any(glob.matches(walk.relative(entry)) for glob in includes):
                continue
            try:
                fd = os.open(entry.name, READ_FLAGS, dir_fd=entry.dir_fd)
            except OSError:
                hits.skipped += 1
                continue
            try:
                self._search_fd(fd, entry.rel, regex, hits)
            finally:
                os.close(fd)

    def _search_fd(self, fd: int, rel: str, regex: re.Pattern[str], hits: _Hits) -> None:
        st = os.fstat(fd)
        ok = stat.S_ISREG(st.st_mode) and st.st_nlink == 1
        if not ok or st.st_size > self.settings.max_file_bytes:
            hits.skipped += 1
            return
        data = os.pread(fd, st.st_size, 0)
        if looks_binary(data[:8192]):
            hits.skipped += 1
            return
        for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), start=1):
            if regex.search(line):
                text = normalize(line.rstrip("\r"))[:_GREP_LINE_CHARS]
                hits.lines.append(f"{rel}:{number}: {text}")
                if hits.full:
                    return

    def _render(self, input: GrepInput, hits: _Hits, walk: Walk | None) -> ToolOutput:
        body = "\n".join(hits.lines) or f"No matches for {input.pattern!r}"
        notes = []
        if hits.full:
            notes.append(f"matches capped at {hits.cap}")
        if walk is not None and walk.truncated:
            notes.append(f"scan stopped after {walk.visited} entries; narrow the path")
        if hits.skipped:
            notes.append(f"{hits.skipped} binary, oversized or hard-linked files skipped")
        return text_output(
            body,
            self.settings.output_cap,
            suffix="\n[" + "; ".join(notes) + "]" if notes else "",
            matches=len(hits.lines),
            truncated=hits.full or bool(walk and walk.truncated),
            skipped=hits.skipped,
        )


def _compile(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as error:
        raise ToolFailure(f"Invalid regular expression {pattern!r}: {error}") from None
