"""``sessionflow/locate.py``: the store a worker says it serves, and workers known to be gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from sessionflow import locate


def test_a_worker_of_this_host_whose_process_exited_is_gone() -> None:
    """The server lists a dead worker's poller for a minute; on its own host we know at once."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = socket.gethostname()
    suffix = locate.identity_suffix("sqlite+aiosqlite:///x.db")
    assert locate.gone(f"{host}/{child.pid} {suffix}")
    assert not locate.gone(f"{host}/{os.getpid()} {suffix}")


def test_a_worker_elsewhere_or_unnamed_is_not_judged() -> None:
    assert not locate.gone("another-host.example/1")
    assert not locate.gone(f"{socket.gethostname()}/not-a-pid")
    assert not locate.gone("a custom identity")


def test_the_store_key_is_read_back_from_an_identity() -> None:
    url = "postgresql+psycopg://root:secret@127.0.0.1:5432/test"
    identity = f"{socket.gethostname()}/1 {locate.identity_suffix(url, 'tenant')}"
    assert locate.key_in_identity(identity) == locate.store_key(url, "tenant")
    assert locate.store_key(url, "tenant") != locate.store_key(url, None)
    assert locate.key_in_identity("host/1") is None
