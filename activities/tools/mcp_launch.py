"""Runs a local MCP server's command and records how it ended, for the error of a call it
died in: ``python -m activities.tools.mcp_launch STATUS_FILE COMMAND [ARG ...]``.

The server inherits this process's stdin, stdout and stderr, so the protocol passes straight
through. When it exits, its exit status (or why it could not start) is written to
``STATUS_FILE`` and this process exits the same way. A SIGTERM (the client closing) is passed
on to the server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType


def main(argv: list[str]) -> int:
    status, command = Path(argv[0]), argv[1:]
    try:
        server = subprocess.Popen(command)
    except OSError as error:
        status.write_text(f"could not start: {error}")
        return 127

    def forward(signum: int, _frame: FrameType | None) -> None:
        server.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = server.wait()
    status.write_text(f"exited with status {code}" if code >= 0 else f"killed by signal {-code}")
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
