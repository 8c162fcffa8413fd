"""Tool process groups a dead worker leaves behind, including one it had no time to record."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.tools import process

DEAD_WORKER = "999999999 0"  # no such pid: a worker that is gone


@pytest.fixture(autouse=True)
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SESSIONFLOW_PROCESS_DIR", str(tmp_path))
    return process.records_dir()


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            process.signal_all(proc.pid, 9)
            proc.wait(timeout=5)


def sleeper(spawn: list[subprocess.Popen[bytes]], token: str) -> subprocess.Popen[bytes]:
    """A command (with a child of its own) started as the bash tool starts one."""
    env = {**os.environ, process.TOKEN_VARIABLE: token}
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    spawn.append(proc)
    # Popen returns once the child forked, not once it exec'd: until then its environment is
    # this process's, without the token the reaper looks for (a command the reaper misses so
    # is met by its next pass, every 10 s). The tests reap a command that runs.
    needle = f"{process.TOKEN_VARIABLE}={token}".encode()
    for _ in range(1000):
        with open(f"/proc/{proc.pid}/environ", "rb") as file:
            if needle in file.read():
                return proc
        time.sleep(0.01)
    raise AssertionError(f"the command {proc.pid} never carried its token")


def test_a_command_whose_worker_died_before_recording_its_pid_is_still_reaped(
    records: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    """Catalogue C1: SIGKILL mid-tool."""
    token = process.intend()
    (records / f"pending-{token}").write_text(DEAD_WORKER)  # the worker died right after
    proc = sleeper(spawn, token)
    assert process.reap_orphans() == [proc.pid]
    assert proc.wait(timeout=5) == -9
    assert not list(records.iterdir())


def test_a_command_whose_killed_worker_is_not_yet_reaped_by_its_parent_is_reaped(
    records: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    """A worker killed under a parent that has not waited for it yet is a zombie: its pid and
    start time still read, but it runs nothing, so its commands are orphans (found by
    ``bench/worker_faults.py``: they were left to run)."""
    # A session of its own, so the spawn fixture's group kill ends it if the test fails.
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    spawn.append(worker)
    token = process.intend()
    (records / f"pending-{token}").write_text(f"{worker.pid} {process.start_time(worker.pid)}")
    proc = sleeper(spawn, token)
    assert process.reap_orphans() == []  # its worker runs
    worker.kill()
    for _ in range(1000):  # a zombie: killed, not waited for
        if Path(f"/proc/{worker.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the killed worker {worker.pid} never became a zombie")
    assert process.reap_orphans() == [proc.pid]
    assert proc.wait(timeout=5) == -9
    worker.wait(timeout=5)


def test_without_proc_nothing_is_reaped(
    records: Path, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where there is no ``/proc`` (macOS), no worker can be told gone: its command runs on."""
    token = process.intend()
    proc = sleeper(spawn, token)
    monkeypatch.setattr(process, "_stat_fields", lambda pid: None)  # before it is recorded
    process.track(proc.pid, token)
    assert process.reap_orphans() == []
    assert proc.poll() is None
    process.untrack(proc.pid)


def test_a_live_workers_command_is_left_alone_before_and_after_its_pid_is_recorded(
    records: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    token = process.intend()
    proc = sleeper(spawn, token)
    assert process.reap_orphans() == []
    process.track(proc.pid, token)
    assert [p.name for p in records.iterdir()] == [str(proc.pid)]  # the pid replaced the token
    assert process.reap_orphans() == []
    assert proc.poll() is None
    process.untrack(proc.pid)
    assert not list(records.iterdir())


def test_a_host_reaps_only_its_own_workers_orphans(
    records: Path, spawn: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessionflow hosts on one machine: an orphan of host A's dead worker is left to A's
    workers; B's reaper never kills a command of A's."""
    monkeypatch.setenv("SESSIONFLOW_HOST", "host-a")
    a_records = process.records_dir()
    token = process.intend()
    (a_records / f"pending-{token}").write_text(DEAD_WORKER)
    proc = sleeper(spawn, token)
    monkeypatch.setenv("SESSIONFLOW_HOST", "host-b")
    assert process.records_dir() != a_records
    assert process.reap_orphans() == []
    assert proc.poll() is None
    monkeypatch.setenv("SESSIONFLOW_HOST", "host-a")
    assert process.reap_orphans() == [proc.pid]
    assert proc.wait(timeout=5) == -9


def test_an_abandoned_start_leaves_no_record(records: Path) -> None:
    process.abandon(process.intend())
    assert not list(records.iterdir())


def test_what_outlived_its_recorded_leader_is_reaped_by_its_token(
    records: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    """Catalogue C1: the recorded leader died with its worker and the rest of its session lives
    on (as a sandbox's PID 1 and command do when the worker dies in the moment before that PID 1
    arms its parent-death signal). The leader's pid names nothing any more; the token the rest
    carries in its environment still finds it, and the reaper kills it."""
    token = process.intend()
    env = {**os.environ, process.TOKEN_VARIABLE: token}
    script = "import subprocess; subprocess.Popen(['sleep', '300'])"
    leader = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    spawn.append(leader)
    process.track(leader.pid, token)
    assert leader.wait(timeout=10) == 0
    left = process.members(leader.pid)
    assert left, "the leader's child outlives it"
    record = records / str(leader.pid)
    _worker, _start, leader_start, kept = record.read_text().rsplit(" ", 3)
    assert kept == token
    record.write_text(f"{DEAD_WORKER} {leader_start} {token}")  # its worker died with it
    assert process.reap_orphans() == [leader.pid]
    assert _emptied(leader.pid), "the leader's session outlived the reaper"
    assert not list(records.iterdir())


def _emptied(session: int, seconds: float = 5) -> bool:
    """No live process left in ``session`` (a killed one may stay a zombie until init reaps)."""
    deadline = time.monotonic() + seconds
    while process.members(session):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True
