"""Process groups of tool commands: started in their own session, killed whole, always reaped.

A command runs as the leader of a new session (``start_new_session``), so its pid is also its
process group id and session id. Killing it means signalling the group *and* every live process
of the session, because a shell with job control (``set -m``) moves background jobs into groups
of their own. A process that calls ``setsid`` itself leaves the session and is out of reach; only
a cgroup or a sandbox could hold it.

Where ``/proc`` exists, "live" excludes zombies: an orphan we killed is reaped by init, which in
some containers never happens, and a zombie holds nothing.

``kill_running`` SIGKILLs every group still running in this process. Worker shutdown cancels
running activities, and cancellation kills their groups; ``kill_running`` is the backstop for
the shutdown path and is registered with ``atexit``.

A worker killed outright (SIGKILL, OOM) runs no backstop, so each running group is also recorded
in a per-host directory with its worker's identity (pid and start time). ``reap_orphans``, run
by every worker at start and then periodically, kills the groups whose worker is gone. The
directory is per sessionflow host (``SESSIONFLOW_HOST``), not only per machine: two hosts
sharing a machine each reap only their own workers' orphans, never a command of the other's. The
record is made *before* the command starts (``intend``): a pid exists only once it runs, so the
record first names a token that the command carries in its environment (``TOKEN_VARIABLE``),
and ``track`` then replaces it with the pid (and keeps the token). A worker killed between the
two leaves a command that the reaper still finds, by its token, in ``/proc``; so does a group
whose leader died with the worker while the rest of it lives on: a sandbox whose own PID 1 had
not yet armed its parent-death signal when bubblewrap died with the worker (a window of a few
milliseconds as a sandbox starts), or a background job of a shell that exited.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import tempfile
import time
import uuid
from contextlib import suppress
from pathlib import Path

_RUNNING: set[int] = set()
_POLL_SECONDS = 0.02
_registered = False


def records_dir() -> Path:
    """Where running groups are recorded: one directory per sessionflow host and user."""
    configured = os.environ.get("SESSIONFLOW_PROCESS_DIR")
    host = os.environ.get("SESSIONFLOW_HOST") or "local"
    return Path(configured or tempfile.gettempdir()) / f"sessionflow-processes-{os.getuid()}-{host}"


TOKEN_VARIABLE = "SESSIONFLOW_TOOL_GROUP"
_PENDING = "pending-"


def _worker_identity() -> str:
    return f"{os.getpid()} {start_time(os.getpid())}"


def intend() -> str:
    """Record a command about to start; returns the token its environment must carry."""
    token = uuid.uuid4().hex
    with suppress(OSError):
        directory = records_dir()
        directory.mkdir(mode=0o700, exist_ok=True)
        (directory / f"{_PENDING}{token}").write_text(_worker_identity())
    return token


def abandon(token: str) -> None:
    """Forget an ``intend`` whose command never started."""
    with suppress(OSError):
        (records_dir() / f"{_PENDING}{token}").unlink()


def track(leader: int, token: str | None = None) -> None:
    """Record a started command's group (replacing its ``intend`` record, if given)."""
    global _registered
    if not _registered:
        atexit.register(kill_running)
        _registered = True
    _RUNNING.add(leader)
    with suppress(OSError):
        directory = records_dir()
        directory.mkdir(mode=0o700, exist_ok=True)
        owner = f"{_worker_identity()} {start_time(leader)} {token or ''}".rstrip()
        (directory / str(leader)).write_text(owner)
    if token is not None:
        abandon(token)  # only now: one of the two records always names the command


def untrack(leader: int) -> None:
    _RUNNING.discard(leader)
    with suppress(OSError):
        (records_dir() / str(leader)).unlink()


def start_time(pid: int) -> str:
    """The kernel's start time of ``pid`` (telling a reused pid from the original)."""
    fields = _stat_fields(str(pid))
    return fields[19].decode() if fields is not None and len(fields) > 19 else "?"


def reap_orphans() -> list[int]:
    """Kill recorded groups whose worker process is gone; returns the leaders killed."""
    killed: list[int] = []
    directory = records_dir()
    if not directory.is_dir():
        return killed
    for record in directory.iterdir():
        with suppress(OSError, ValueError):
            worker, worker_start, *started = record.read_text().split()
            if _runs(int(worker), worker_start):
                continue  # its worker still runs it
            if record.name.startswith(_PENDING):
                # The worker died between starting the command and recording its pid.
                killed += _kill_carrying(record.name.removeprefix(_PENDING))
            elif start_time(leader := int(record.name)) == started[0]:
                signal_all(leader, signal.SIGKILL)
                killed.append(leader)
            elif len(started) > 1:
                # The leader is gone (its pid may even be another process's now): what it
                # started is found by the token in its environment.
                killed += _kill_carrying(started[1])
            record.unlink()
    return killed


def _runs(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` still runs: a killed worker
    whose parent has not reaped it yet (a zombie) runs nothing any more."""
    fields = _stat_fields(str(pid))
    if fields is None:
        # Gone, or no /proc (macOS): then the start times compare as unknown, "?" == "?",
        # and the worker counts as running (no reaping where nothing can be told apart).
        return start_time(pid) == started
    if len(fields) <= 19 or fields[0] in (b"Z", b"X"):
        return False
    return fields[19].decode() == started


def _kill_carrying(token: str) -> list[int]:
    sessions = sorted(_carrying(token))
    for session in sessions:
        signal_all(session, signal.SIGKILL)
    return sessions


def _carrying(token: str) -> set[int]:
    """The sessions of live processes whose environment carries ``token`` (via ``/proc``)."""
    needle = f"{TOKEN_VARIABLE}={token}".encode()
    sessions: set[int] = set()
    with suppress(OSError):
        for pid in (name for name in os.listdir("/proc") if name.isdigit()):
            try:
                with open(f"/proc/{pid}/environ", "rb") as file:
                    carries = needle in file.read().split(b"\0")
            except OSError:
                continue
            fields = _stat_fields(pid)
            if carries and fields is not None and fields[0] not in (b"Z", b"X"):
                sessions.add(int(fields[3]))
    return sessions


def running() -> frozenset[int]:
    return frozenset(_RUNNING)


def kill_running() -> None:
    """SIGKILL every command group this process started that has not been reaped yet."""
    for leader in list(_RUNNING):
        signal_all(leader, signal.SIGKILL)


def _stat_fields(pid: str) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields follow the last ")".
    return data[data.rfind(b")") + 2 :].split()


def members(leader: int) -> list[int] | None:
    """Live processes in the leader's group or session; None where ``/proc`` is missing."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    found = []
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        if leader in (int(fields[2]), int(fields[3])):
            found.append(int(pid))
    return found


def alive(leader: int) -> bool:
    found = members(leader)
    if found is not None:
        return bool(found)
    try:
        os.killpg(leader, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def signal_all(leader: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for pid in members(leader) or ():
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


async def _gone(leader: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(leader):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECONDS)
    return True


async def kill_group(leader: int, grace: float) -> None:
    """SIGTERM the group and its session, SIGKILL what is left after ``grace``, wait for none.

    SIGCONT follows SIGTERM so that a stopped process gets to handle it.
    """
    if not alive(leader):
        return
    signal_all(leader, signal.SIGTERM)
    signal_all(leader, signal.SIGCONT)
    if await _gone(leader, grace):
        return
    signal_all(leader, signal.SIGKILL)
    await _gone(leader, 1.0)
