"""An MCP server for the tests, written with the SDK's own server API (``MCPServer``).

``python mcp_server.py stdio CALLS_FILE`` or ``python mcp_server.py http PORT CALLS_FILE``.
Every call appends its tool's name to CALLS_FILE before it does anything else, so a test counts
what reached the server.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from mcp.server import MCPServer
from mcp.types import ResourceLink, ToolAnnotations

server = MCPServer("sessionflow-test")
CALLS = Path(sys.argv[-1])
READ_ONLY = ToolAnnotations(read_only_hint=True)


def _count(name: str) -> None:
    with CALLS.open("a") as calls:
        calls.write(name + "\n")


@server.tool(description="Read a note (read-only).", annotations=READ_ONLY)
def read_note(topic: str) -> str:
    _count("read_note")
    return f"note about {topic}"


@server.tool(description="Add one to the counter (changes state, unannotated).")
def bump(by: int = 1) -> dict[str, int]:
    _count("bump")
    return {"bumped": by}


@server.tool(description="Set a key.", annotations=ToolAnnotations(idempotent_hint=True))
def put(key: str) -> str:
    _count("put")
    return f"stored {key}"


@server.tool(description="Wait a while (read-only).", annotations=READ_ONLY)
def wait(seconds: float) -> str:
    _count("wait")
    time.sleep(seconds)
    return f"waited {seconds}"


@server.tool(description="Change state slowly (unannotated).")
def slow_bump(seconds: float) -> str:
    _count("slow_bump")
    time.sleep(seconds)
    return "bumped slowly"


@server.tool(
    description="Write a file (as a file server's write_file: idempotent, not read-only).",
    annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True),
)
def write_file(path: str, content: str) -> str:
    _count("write_file")
    Path(path).write_text(content)
    return f"wrote {path}"


@server.tool(description="Make a file and link to it (its path is in no argument).")
def make_linked(directory: str, file_name: str) -> ResourceLink:
    _count("make_linked")
    made = Path(directory) / file_name
    made.write_text("made by the server\n")
    return ResourceLink(name=file_name, uri=made.as_uri())


@server.tool(description="Crash the server.")
def crash() -> str:
    _count("crash")
    print("about to crash: disk on fire", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool(description="A big answer.", annotations=READ_ONLY)
def big(megabytes: int) -> str:
    _count("big")
    return "x" * (megabytes * 1024 * 1024)


@server.tool(description="Fail as a tool.", annotations=READ_ONLY)
def refuse() -> str:
    _count("refuse")
    raise ValueError("refused on purpose")


if __name__ == "__main__":
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
