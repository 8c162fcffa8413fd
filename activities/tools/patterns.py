"""Glob patterns over workspace-relative POSIX paths, shared by ``glob``, ``grep`` and the
protected-path matcher.

``*`` and ``?`` stay inside one path component, ``**`` spans any number of components
(``**/`` also matches none), ``[...]`` is a character class and ``{a,b}`` an alternation
(not nested). A pattern without ``/`` matches a file name at any depth (as in ``.gitignore``);
one with ``/``, or any anchored pattern, matches the whole relative path. Python 3.11's
``fnmatch`` lets ``*`` cross ``/``, hence this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache


def _class(pattern: str, start: int) -> tuple[str, int]:
    """The regex of a ``[...]`` class starting at ``start``, and the index after it."""
    end = start + 1
    if end < len(pattern) and pattern[end] in "!^":
        end += 1
    if end < len(pattern) and pattern[end] == "]":
        end += 1
    while end < len(pattern) and pattern[end] != "]":
        end += 1
    if end >= len(pattern):
        return re.escape("["), start + 1
    body = pattern[start + 1 : end].replace("\\", "\\\\")
    if body[:1] in ("!", "^"):
        body = "^" + body[1:]
    return f"(?!/)[{body}]", end + 1


def _alternation(pattern: str, start: int) -> tuple[str, int]:
    end = pattern.find("}", start)
    if end < 0:
        return re.escape("{"), start + 1
    options = pattern[start + 1 : end].split(",")
    return "(?:" + "|".join(_translate(option) for option in options) + ")", end + 1


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            piece, i = _class(pattern, i)
            out.append(piece)
        elif char == "{":
            piece, i = _alternation(pattern, i)
            out.append(piece)
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


@lru_cache(maxsize=512)
def compile_glob(pattern: str, *, fold_case: bool = False) -> re.Pattern[str]:
    flags = re.DOTALL | (re.IGNORECASE if fold_case else 0)
    return re.compile(_translate(pattern.strip("/")) + r"\Z", flags)


@dataclass(frozen=True)
class Glob:
    """A compiled pattern; ``matches`` takes a relative POSIX path.

    ``anchored`` patterns always match the whole path, as a shell glob does (``*.py`` is then
    top-level only and ``**/*.py`` is recursive).
    """

    pattern: str
    fold_case: bool = False
    anchored: bool = False

    @property
    def anywhere(self) -> bool:
        return not self.anchored and "/" not in self.pattern.strip("/")

    def matches(self, rel: str) -> bool:
        subject = rel.rsplit("/", 1)[-1] if self.anywhere else rel
        return compile_glob(self.pattern, fold_case=self.fold_case).match(subject) is not None

    def depth(self) -> int | None:
        """How many components a match can have at most (None: unbounded)."""
        if self.anywhere or "**" in self.pattern:
            return None
        return self.pattern.strip("/").count("/") + 1
