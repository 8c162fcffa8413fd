"""Identifiers: generation and validation at the edge.

Generated ids are ``<prefix>_`` + 12 hex digits of epoch milliseconds + 14 random hex digits,
so they sort by creation time and are unique without coordination.
"""

from __future__ import annotations

import os
import re
import secrets
import time

from sessionflow.errors import InvalidHostError, InvalidIdError

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
HOST_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def new_id(prefix: str) -> str:
    """A new time-sortable id such as ``ses_0193a1b2c3d4e5f6a7b8c9d0e1f2``."""
    return f"{prefix}_{int(time.time() * 1000):012x}{secrets.token_hex(7)}"


def new_ids(prefix: str, count: int) -> list[str]:
    """``count`` fresh ids at once (one clock read, one random draw): for batches."""
    stamp = f"{prefix}_{int(time.time() * 1000):012x}"
    randomness = os.urandom(7 * count).hex()
    return [stamp + randomness[14 * i : 14 * i + 14] for i in range(count)]


def session_id() -> str:
    return new_id("ses")


def message_id() -> str:
    return new_id("msg")


def event_id() -> str:
    return new_id("evt")


def validate_id(value: object, kind: str = "session") -> str:
    """Return ``value`` if it is a well-formed id, else raise ``InvalidIdError``."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidIdError(kind, value)
    return value


def validate_host(value: object) -> str:
    """Return ``value`` if it is a well-formed host name, else raise ``InvalidHostError``."""
    if not isinstance(value, str) or not HOST_PATTERN.match(value):
        raise InvalidHostError(value)
    return value
