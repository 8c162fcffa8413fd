"""Where a command finds the store and the dev server's state, wherever it runs from.

The store is, in this order: ``--database`` (or the ``database_url`` a caller passes),
``SESSIONFLOW_DATABASE_URL``, else ``sessionflow.db`` in the nearest ``.sessionflow/`` found
walking up from the working directory, else ``./.sessionflow/sessionflow.db`` (created by the
first command that writes: ``new``, ``dev``, ``worker``, ``demo``). A relative SQLite path is
made absolute here, so a worker and a CLI started in different directories that name the same
file really share it, and every message can print the one path in use.

Pure (no imports of ours, no SQLAlchemy): ``--help`` pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_NAME = ".sessionflow"
DATABASE_FILE = "sessionflow.db"
_SQLITE_PREFIX = "sqlite"


def state_dir(start: Path | None = None) -> Path:
    """The nearest ``.sessionflow/`` at or above ``start`` (default: the working directory),
    or ``start/.sessionflow`` when there is none yet."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / STATE_DIR_NAME
        if candidate.is_dir():
            return candidate
    return here / STATE_DIR_NAME


def database_url(explicit: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The store's URL: ``explicit``, else the environment, else the nearest state directory."""
    env = os.environ if environ is None else environ
    url = explicit or env.get("SESSIONFLOW_DATABASE_URL")
    if not url:
        return f"sqlite+aiosqlite:///{state_dir() / DATABASE_FILE}"
    return absolute(url)


def absolute(url: str) -> str:
    """``url`` with a relative SQLite path made absolute against the working directory."""
    path = sqlite_path(url)
    if path is None or path.is_absolute():
        return url
    head, _, rest = url.partition(":///")
    query = rest.partition("?")[1] + rest.partition("?")[2]
    return f"{head}:///{Path.cwd() / path}{query}"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (``None`` for other databases and in-memory ones)."""
    if not url.startswith(_SQLITE_PREFIX) or ":///" not in url:
        return None
    database = url.partition(":///")[2].partition("?")[0]
    if not database or database == ":memory:":
        return None
    return Path(database)
