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
by every worker at start and then periodically, kills the groups whose worker is gone.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import signal
import tempfile
import time
from contextlib import suppress
from pathlib import Path

_RUNNING: set[int] = set()
_POLL_SECONDS = 0.02
_registered = False


def records_dir() -> Path:
    """Where running groups are recorded: one directory per host and user."""
    configured = os.environ.get("SESSIONFLOW_PROCESS_DIR")
    return Path(configured or tempfile.gettempdir()) / f"sessionflow-processes-{os.getuid()}"


def track(leader: int) -> None:
    global _registered
    if not _registered:
        atexit.register(kill_running)
        _registered = True
    _RUNNING.add(leader)
    with suppress(OSError):
        directory = records_dir()
        directory.mkdir(mode=0o700, exist_ok=True)
        owner = f"{os.getpid()} {start_time(os.getpid())} {start_time(leader)}"
        (directory / str(leader)).write_text(owner)


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
            worker, worker_start, leader_start = record.read_text().split()
            leader = int(record.name)
            if start_time(int(worker)) == worker_start:
                continue  # its worker still runs it
            if start_time(leader) == leader_start:
                signal_all(leader, signal.SIGKILL)
                killed.append(leader)
            record.unlink()
    return killed


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
