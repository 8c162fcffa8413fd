"""Where a command finds the store and the dev server's state, wherever it runs from.

The store is, in this order: ``--database`` (or the ``database_url`` a caller passes),
``SESSIONFLOW_DATABASE_URL``, else ``sessionflow.db`` in the nearest ``.sessionflow/`` found
walking up from the working directory, else ``./.sessionflow/sessionflow.db`` (created by the
first command that writes: ``new``, ``dev``, ``worker``, ``demo``). A relative SQLite path is
made absolute here, so a worker and a CLI started in different directories that name the same
file really share it, and every message can print the one path in use.

When no ``.sessionflow/`` is found upward, the store of a stack running on this machine for
the same Temporal address and task queue comes before ``./.sessionflow/``: ``sessionflow dev``
and ``sessionflow worker`` publish the store they write to, keyed by address and queue, in
``$XDG_STATE_HOME/sessionflow/stacks/`` (default ``~/.local/state/sessionflow/stacks/``;
``SESSIONFLOW_STACKS_DIR`` overrides it). So ``dev`` in one directory and ``new`` in an
unrelated project use one store, not two. A record names its process; one whose process is
gone is ignored (and removed), so a worker killed with SIGKILL leaves nothing that misleads.
Workers also carry their store's key in their Temporal identity (``identity_suffix``), which
is what ``new`` checks, across machines too.

Pure (no imports of ours, no SQLAlchemy): ``--help`` pays for it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

STATE_DIR_NAME = ".sessionflow"
DATABASE_FILE = "sessionflow.db"
_SQLITE_PREFIX = "sqlite"


def state_dir(start: Path | None = None) -> Path:
    """The nearest ``.sessionflow/`` at or above ``start`` (default: the working directory),
    or ``start/.sessionflow`` when there is none yet."""
    here = (start or Path.cwd()).resolve()
    return found_state_dir(here) or here / STATE_DIR_NAME


def found_state_dir(start: Path | None = None) -> Path | None:
    """The nearest existing ``.sessionflow/`` at or above ``start``, if there is one."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / STATE_DIR_NAME
        if candidate.is_dir():
            return candidate
    return None


def database_url(
    explicit: str | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    address: str | None = None,
    task_queue: str | None = None,
) -> str:
    """The store's URL: ``explicit``, else the environment, else the nearest state directory,
    else the store a stack running here serves on ``address`` and ``task_queue``, else
    ``./.sessionflow/``."""
    env = os.environ if environ is None else environ
    url = explicit or env.get("SESSIONFLOW_DATABASE_URL")
    if url:
        return absolute(url)
    found = found_state_dir()
    if found is None and address and task_queue:
        served = store_of(address, task_queue)
        if served:
            return served
    return f"sqlite+aiosqlite:///{(found or state_dir()) / DATABASE_FILE}"


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


# --- running stacks ------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_IDENTITY_KEY = re.compile(r"\bstore:([0-9a-f]{12})\b")


@dataclass(frozen=True)
class StackRecord:
    """A running process that serves ``database_url`` to the workers of ``task_queue``."""

    address: str
    task_queue: str
    database_url: str
    pid: int
    kind: str  # "dev" or "worker"

    @property
    def key(self) -> str:
        return store_key(self.database_url)


def directory(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get("SESSIONFLOW_STACKS_DIR"):
        return Path(env["SESSIONFLOW_STACKS_DIR"])
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "sessionflow" / "stacks"


def publish(record: StackRecord) -> Path:
    """Record that this process serves ``record.database_url``; returns the record's file."""
    folder = directory()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{_name(record.address, record.task_queue)}.{record.pid}.json"
    data = record.__dict__ | {"started": time.time()}
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    temporary.replace(path)
    return path


def withdraw(path: Path) -> None:
    path.unlink(missing_ok=True)


def running(address: str, task_queue: str) -> list[StackRecord]:
    """The live records for ``address`` and ``task_queue``, newest first."""
    found: list[tuple[float, StackRecord]] = []
    for path in directory().glob(f"{_name(address, task_queue)}.*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            data = json.loads(path.read_text())
            record = StackRecord(
                address=data["address"],
                task_queue=data["task_queue"],
                database_url=data["database_url"],
                pid=int(data["pid"]),
                kind=str(data.get("kind", "worker")),
            )
            if not process_alive(record.pid):
                path.unlink(missing_ok=True)
                continue
            if (record.address, record.task_queue) != (address, task_queue):
                continue  # a longer queue name that shares the file name's prefix
            found.append((float(data.get("started", 0)), record))
    return [record for _, record in sorted(found, key=lambda item: -item[0])]


def store_of(address: str, task_queue: str) -> str | None:
    """The store the running stack on ``address`` and ``task_queue`` serves, if one runs here."""
    records = running(address, task_queue)
    return records[0].database_url if records else None


def described(key: str, address: str, task_queue: str) -> str:
    """How to name the store with ``key``: its URL when a stack on this machine serves it."""
    for record in running(address, task_queue):
        if record.key == key:
            return f"{safe_url(record.database_url)} (store {key})"
    return f"store {key}, on another machine or not recorded here"


def store_key(url: str, schema: str | None = None) -> str:
    """A short, stable name for the database ``url`` points at (and ``schema`` in it): the
    same for every spelling of one SQLite file, every driver and password of one server."""
    path = sqlite_path(url)
    if path is not None:
        identity = f"sqlite:{os.path.realpath(path)}"
    else:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        host = "127.0.0.1" if host in ("localhost", "::1") else host
        scheme = parts.scheme.partition("+")[0]
        user = unquote(parts.username or "")
        identity = f"{scheme}://{user}@{host}:{parts.port or ''}{parts.path}"
    if schema:
        identity += f"#{schema}"
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def identity_suffix(url: str, schema: str | None = None) -> str:
    """What a worker's Temporal identity carries so that clients can tell its store."""
    return f"store:{store_key(url, schema)}"


def key_in_identity(identity: str) -> str | None:
    found = _IDENTITY_KEY.search(identity)
    return found.group(1) if found else None


def gone(identity: str) -> bool:
    """Whether the worker with this Temporal identity (``host/pid ...``, as ``worker.py``
    names its workers) ran on this host in a process that has exited. The server lists a
    poller for a minute or more after its worker died; on the worker's own host that need not
    be waited out."""
    host, _, rest = identity.partition("/")
    pid = rest.partition(" ")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return not process_alive(int(pid))


def safe_url(url: str) -> str:
    """``url`` without its password, fit to print."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def _name(address: str, task_queue: str) -> str:
    return _UNSAFE.sub("_", f"{address}__{task_queue}")


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs: a killed process its parent has not reaped yet (a zombie) does
    not, though signals still reach it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
