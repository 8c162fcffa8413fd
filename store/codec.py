"""The one text normalization of the store, identical on SQLite and PostgreSQL.

Every JSON document we store (event payloads, message data, prompts) is written by ``dumps``:
compact JSON, non-ASCII kept as UTF-8, and two escapes that make any Python string storable:

- NUL is written as ``\\u0000`` (JSON's own escape), because PostgreSQL ``text`` rejects the byte;
- a lone surrogate (U+D800 to U+DFFF) is written as its ``\\udnnn`` escape, because neither
  driver can encode it to UTF-8.

``loads`` restores the exact string. One string JSON cannot spell: a lone high surrogate right
before a lone low one (two code points, e.g. two text deltas joined), whose two escapes every JSON
parser reads as the one code point of the pair. A document holding one is stored *marked*:
``~`` (never the first character of JSON) and then JSON of its strings with each backslash
written twice and each surrogate as the six characters ``\\udnnn``; ``loads`` undoes both.

Invalid UTF-8 from a subprocess or a file should be decoded with ``errors="surrogateescape"``:
its bytes become lone surrogates U+DC80..U+DCFF, survive the round trip, and
``encode("utf-8", "surrogateescape")`` gives back the original bytes.

Plain text columns (a session's title and directory) are search copies: ``column_text`` replaces
NUL and lone surrogates with U+FFFD there; the event keeps the exact original.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

T = TypeVar("T")

_SURROGATE = re.compile("[\ud800-\udfff]")
_SPLIT_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_MARK = "~"
_PROTECTED = re.compile(r"\\(\\|u[0-9a-f]{4})")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> str:
    text = _json(value)
    if not _SURROGATE.search(text):
        return text
    if _SPLIT_PAIR.search(text):
        return _MARK + _json(_strings(value, _protect))
    return _SURROGATE.sub(_escape, text)


def _protect(text: str) -> str:
    return _SURROGATE.sub(_escape, text.replace("\\", "\\\\"))


def _unprotect(text: str) -> str:
    return _PROTECTED.sub(lambda m: "\\" if m[1] == "\\" else chr(int(m[1][1:], 16)), text)


def _strings(value: Any, change: Any) -> Any:
    """``value`` (JSON data) with ``change`` applied to every string in it, keys included."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {change(k): _strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strings(v, change) for v in value]
    return value


def dump_model(model: BaseModel, *, exclude: set[str] | None = None) -> str:
    """A model as stored JSON (without the fields in ``exclude``). pydantic's serializer is
    the fast path; it refuses lone surrogates, and only then does the model go through
    ``dumps``."""
    try:
        return model.model_dump_json(exclude=exclude)
    except ValueError:
        return dumps(model.model_dump(mode="json", exclude=exclude))


def loads(text: str | bytes) -> Any:
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    if text.startswith(_MARK):
        return _strings(json.loads(text[1:]), _unprotect)
    return json.loads(text)


def load_model(adapter: TypeAdapter[T], text: str) -> T:
    """Stored JSON as a model. pydantic's parser is the fast path; it refuses escaped lone
    surrogates, and only then does the text go through ``loads``."""
    try:
        return adapter.validate_json(text)
    except ValidationError as error:
        if not any(e["type"] == "json_invalid" for e in error.errors()):
            raise
    return adapter.validate_python(loads(text))


def first_surrogate(text: str) -> int | None:
    """Where ``text`` holds its first lone surrogate, or None when it is Unicode text."""
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def column_text(value: str) -> str:
    return _SURROGATE.sub("\ufffd", value.replace("\x00", "\ufffd"))
