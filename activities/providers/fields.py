"""Typed reads from decoded provider events, which may hold anything a hostile server sends.

The SDKs build their event objects without validation, so a field typed ``str`` can hold a
number, a list or nothing. Parsers read every field through these helpers: a field of the wrong
type reads as absent, never as a crash.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel


def plain(raw: object) -> dict[str, Any] | None:
    """An SDK event as the JSON object the server sent, or ``None`` when it is not an object."""
    if isinstance(raw, BaseModel):
        # ``warnings=False``: an unvalidated field of the wrong type is expected here, not a bug.
        raw = raw.model_dump(warnings=False, exclude_unset=True, by_alias=True)
    return raw if isinstance(raw, dict) else None


def text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) else None


def count(data: dict[str, Any], key: str) -> int | None:
    """A non-negative whole number, or ``None`` (booleans, NaN and negatives are not counts)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def obj(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def items(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


def dumps(value: Any) -> str:
    """Compact JSON text of a decoded value (never fails: decoded values are JSON)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
