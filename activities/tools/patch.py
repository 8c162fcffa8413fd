"""The patch format of ``apply_patch`` (the one the reference agent's models write), parsed and
applied to text in memory: no file is touched here.

    *** Begin Patch
    *** Add File: path/new.py
    +line of the new file
    *** Update File: path/old.py
    *** Move to: path/renamed.py
    @@ def context():
     a context line
    -a removed line
    +an added line
    *** Delete File: path/gone.py
    *** End Patch

An update's hunks apply in order, each after the previous one: its context and removed lines
must be found in the file (exactly, else ignoring trailing whitespace, else ignoring
surrounding whitespace), after the line its ``@@`` header names when it names one. A hunk that
cannot be found fails the whole patch, naming the file and the hunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from activities.tools.base import ToolFailure

BEGIN, END = "*** Begin Patch", "*** End Patch"
_ADD, _UPDATE, _DELETE, _MOVE = (
    "*** Add File: ",
    "*** Update File: ",
    "*** Delete File: ",
    ("*** Move to: "),
)
_EOF = "*** End of File"


@dataclass
class Hunk:
    header: str  # the text after ``@@`` (a line to find first), "" without one
    old: list[str] = field(default_factory=list)  # context and removed lines, in order
    new: list[str] = field(default_factory=list)  # context and added lines, in order
    at_end: bool = False  # ``*** End of File``: the hunk ends the file


@dataclass
class FileChange:
    kind: Literal["add", "update", "delete"]
    path: str
    move_to: str | None = None
    lines: list[str] = field(default_factory=list)  # an added file's lines
    hunks: list[Hunk] = field(default_factory=list)


class PatchError(ToolFailure):
    """A patch that does not parse or does not apply; nothing was changed."""


def parse(text: str) -> list[FileChange]:
    lines = text.replace("\r\n", "\n").strip("\n").split("\n")
    if not lines or lines[0].strip() != BEGIN:
        raise PatchError(f"the patch must start with '{BEGIN}'")
    if lines[-1].strip() != END:
        raise PatchError(f"the patch must end with '{END}'")
    changes: list[FileChange] = []
    for number, line in enumerate(lines[1:-1], start=2):
        _parse_line(changes, line, number)
    if not changes:
        raise PatchError("the patch changes no file")
    return changes


def _parse_line(changes: list[FileChange], line: str, number: int) -> None:
    for prefix, kind in ((_ADD, "add"), (_UPDATE, "update"), (_DELETE, "delete")):
        if line.startswith(prefix):
            path = line[len(prefix) :].strip()
            if not path:
                raise PatchError(f"line {number}: '{prefix.strip()}' names no file")
            changes.append(FileChange(kind, path))  # type: ignore[arg-type]
            return
    if not changes:
        raise PatchError(f"line {number}: expected '*** Add/Update/Delete File: <path>'")
    change = changes[-1]
    if line.startswith(_MOVE) and change.kind == "update" and not change.hunks:
        change.move_to = line[len(_MOVE) :].strip()
    elif change.kind == "add":
        if not line.startswith("+"):
            raise PatchError(f"line {number}: every line of an added file starts with '+'")
        change.lines.append(line[1:])
    elif change.kind == "delete":
        if line.strip():
            raise PatchError(f"line {number}: a deleted file takes no lines")
    else:
        _parse_hunk_line(change, line, number)


def _parse_hunk_line(change: FileChange, line: str, number: int) -> None:
    if line.startswith("@@"):
        change.hunks.append(Hunk(header=line[2:].strip()))
        return
    if line.strip() == _EOF and change.hunks:
        change.hunks[-1].at_end = True
        return
    if not change.hunks:
        change.hunks.append(Hunk(header=""))  # a first hunk may omit its @@
    hunk = change.hunks[-1]
    marker, body = (line[:1], line[1:]) if line else (" ", "")
    if marker == " ":
        hunk.old.append(body)
        hunk.new.append(body)
    elif marker == "-":
        hunk.old.append(body)
    elif marker == "+":
        hunk.new.append(body)
    else:
        raise PatchError(f"line {number}: a hunk line starts with ' ', '-' or '+': {line!r}")


def apply(change: FileChange, text: str) -> str:
    """``change``'s hunks applied to ``text`` (an update's file)."""
    ending = "\r\n" if "\r\n" in text else "\n"
    lines = text.replace("\r\n", "\n").split("\n")
    final_newline = text.endswith("\n")
    if final_newline:
        lines.pop()
    cursor = 0
    for index, hunk in enumerate(change.hunks, start=1):
        if not hunk.old and not hunk.new:
            continue
        start = _locate(lines, hunk, cursor)
        if start is None:
            shown = hunk.header or (hunk.old[0] if hunk.old else "(insertion)")
            raise PatchError(
                f"{change.path}: hunk {index} ({shown!r}) does not match the file; read it "
                f"again and resend the patch with its exact lines"
            )
        lines[start : start + len(hunk.old)] = hunk.new
        cursor = start + len(hunk.new)
    return ending.join(lines) + (ending if final_newline or not lines else "")


def _locate(lines: list[str], hunk: Hunk, cursor: int) -> int | None:
    if hunk.header:
        found = _find(lines, [hunk.header], cursor)
        if found is None:
            return None
        cursor = found + (0 if hunk.old and _same(lines[found], hunk.old[0], str.strip) else 1)
    if not hunk.old:
        return len(lines) if hunk.at_end else cursor
    if hunk.at_end:
        start = len(lines) - len(hunk.old)
        return start if start >= cursor and _matches(lines, hunk.old, start) else None
    return _find(lines, hunk.old, cursor)


def _find(lines: list[str], wanted: list[str], cursor: int) -> int | None:
    for normal in (None, str.rstrip, str.strip):
        for start in range(cursor, len(lines) - len(wanted) + 1):
            if _matches(lines, wanted, start, normal):
                return start
    return None


def _matches(lines: list[str], wanted: list[str], start: int, normal: object = None) -> bool:
    return all(_same(lines[start + i], w, normal) for i, w in enumerate(wanted))


def _same(line: str, wanted: str, normal: object = None) -> bool:
    if callable(normal):
        return bool(normal(line) == normal(wanted))
    return line == wanted
