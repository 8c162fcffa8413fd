"""A throwaway PostgreSQL cluster a test may restart, stop or kill (catalogue C4).

The suite's shared server serves every test running in parallel, so no test may restart it.
``Cluster`` is one of its own: ``initdb`` of the PostgreSQL binaries installed here into a
temporary folder owned by the ``postgres`` OS user (the server refuses to run as root), trust
authentication, a free TCP port on 127.0.0.1 and its unix socket in that folder.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

APT_HINT = "apt-get install -y postgresql-15  # initdb, pg_ctl and postgres for C4's own cluster"
OS_USER = "postgres"
START_TIMEOUT_S = 60
REAP_WAIT_S = 0.2  # init here reaps orphans only every second or two


class ClusterError(RuntimeError):
    pass


def binaries() -> Path:
    """The newest installed PostgreSQL's bin folder; a clear failure if there is none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if not found:
        raise ClusterError(f"no PostgreSQL server binaries (initdb) are installed: {APT_HINT}")
    return Path(found[-1]).parent


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.parent.name)
    except ValueError:
        return 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """One postmaster on ``root/data``; every command runs as the ``postgres`` OS user."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.bin = binaries()

    @classmethod
    def create(cls) -> Cluster:
        # Under /tmp, not pytest's tmp_path: a unix socket's path must stay under 108 bytes.
        root = Path(tempfile.mkdtemp(prefix="sf-pg-"))
        shutil.chown(root, OS_USER, OS_USER)
        cluster = cls(root, free_port())
        cluster._run(
            "initdb", "-D", str(cluster.data), "-U", OS_USER, "--auth=trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {cluster.port}\n"
                "listen_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{root}'\n"
                "max_connections = 100\n"
                "shared_buffers = 16MB\n"
                # C4 holds a row across a restart in a prepared transaction.
                "max_prepared_transactions = 4\n"
            )
        cluster.start()
        return cluster

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{OS_USER}@127.0.0.1:{self.port}/{database}"

    def libpq(self, database: str = "postgres") -> str:
        return f"postgresql://{OS_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.libpq(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    # --- what happens to the server ----------------------------------------------------------

    def start(self) -> None:
        """``pg_ctl start``, waiting until the server accepts connections. After a kill -9 the
        data folder still holds the dead postmaster's ``postmaster.pid``: ``pg_ctl`` sees its
        process gone and starts anyway (crash recovery replays the WAL first)."""
        self._pg_ctl("start", "-w", "-t", str(START_TIMEOUT_S), "-l", str(self.root / "log"))

    def restart_fast(self) -> None:
        """``pg_ctl restart -m fast``: every session is told to end (57P01), open transactions
        roll back, a checkpoint is written, and the server starts again."""
        self._pg_ctl("restart", "-m", "fast", "-w", "-t", str(START_TIMEOUT_S),
                     "-l", str(self.root / "log"))  # fmt: skip

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: every process quits at once, no checkpoint (the next
        start is a crash recovery)."""
        self._pg_ctl("stop", "-m", "immediate", "-w")

    def kill_postmaster(self) -> None:
        """``kill -9`` of the postmaster, then wait for its children to notice and exit: until
        they have, the old shared memory is attached and a new postmaster refuses to start."""
        pid = self.postmaster_pid()
        children = _children(pid)
        os.kill(pid, signal.SIGKILL)
        _wait_gone(children)
        if not (self.data / "postmaster.pid").exists():
            raise ClusterError("postmaster.pid vanished after kill -9: the test proves nothing")
        if not _reaped(pid, timeout_s=REAP_WAIT_S):
            # The dead postmaster is a zombie its parent (init, here) has not reaped yet, and
            # postgres takes a pid that answers kill(pid, 0) for a live postmaster: pg_ctl
            # start then refuses ("lock file already exists", for the data folder and for the
            # socket). Both lock files are stale; under an init that reaps at once (systemd,
            # CI's runner) they would be seen to be, and pg_ctl start copes on its own.
            (self.data / "postmaster.pid").unlink()
            (self.root / f".s.PGSQL.{self.port}.lock").unlink(missing_ok=True)

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().splitlines()[0])

    def running(self) -> bool:
        done = subprocess.run(
            self._as_postgres(str(self.bin / "pg_ctl"), "status", "-D", str(self.data)),
            capture_output=True,
        )
        return done.returncode == 0

    def destroy(self) -> None:
        if self.running():
            self._pg_ctl("stop", "-m", "immediate", "-w")
        shutil.rmtree(self.root, ignore_errors=True)

    # --- plumbing ----------------------------------------------------------------------------

    def _pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", *args[:1], "-D", str(self.data), *args[1:])

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            self._as_postgres(str(self.bin / program), *args),
            capture_output=True,
            text=True,
            cwd=self.root,
        )
        if done.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise ClusterError(
                f"{program} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout}{done.stderr}\n{tail}"
            )

    @staticmethod
    def _as_postgres(*command: str) -> list[str]:
        if os.geteuid() != 0:
            return list(command)  # already an unprivileged user: the server runs as us
        return ["runuser", "-u", OS_USER, "--", *command]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the postmaster's backends and helpers)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(Path(stat).parent.name))
    return found


def _wait_gone(pids: list[int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while _alive(pid):
            if time.monotonic() > deadline:
                raise ClusterError(f"process {pid} outlived its killed postmaster")
            time.sleep(0.02)


def _reaped(pid: int, *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's wait is missing
