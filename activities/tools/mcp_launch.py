"""Runs a local MCP server's command and records how it ended, for the error of a call it
died in: ``python -m activities.tools.mcp_launch STATUS_FILE COMMAND [ARG ...]``.

The server inherits this process's stdin, stdout and stderr, so the protocol passes straight
through, and runs in a process group of its own (``STATUS_FILE.pid`` holds this process's pid
and the group's). When it exits, its exit status (or why it could not start) is written to
``STATUS_FILE`` and this process exits the same way. A SIGTERM (the client closing) goes on to
the server's group, and a SIGKILL follows if it is still there 3 s later. The worker dying
counts as a SIGTERM (``PR_SET_PDEATHSIG``): a server never outlives its worker by more than that.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType

_PR_SET_PDEATHSIG = 1
_GRACE_S = 3.0


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the client's close still stops the server
        return
    if os.getppid() == 1:  # the worker died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    status, command = Path(argv[0]), argv[1:]
    try:
        server = subprocess.Popen(command, start_new_session=True)
    except OSError as error:
        status.write_text(f"could not start: {error}")
        return 127
    Path(f"{status}.pid").write_text(f"{os.getpid()} {server.pid}")

    def kill_later() -> None:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)

    def forward(signum: int, _frame: FrameType | None) -> None:
        try:
            os.killpg(server.pid, signum)
        except ProcessLookupError:
            return
        timer = threading.Timer(_GRACE_S, kill_later)
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    _die_with_parent()
    code = server.wait()
    status.write_text(f"exited with status {code}" if code >= 0 else f"killed by signal {-code}")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
