"""Fixtures for the built-in tools: a workspace next to an audited outside directory.

Tools are called directly with a ``ToolContext``; no Temporal. The audit watches the outside
directory with inotify (every open, read, write, attribute change, create, delete or move in it,
and reads, writes and attribute changes of each file there however it is reached, hard links
included) and also compares contents and mtimes before and after.
"""

from __future__ import annotations

import ctypes
import os
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from activities.tools.base import Tool, ToolContext, ToolOutput
from activities.tools.builtin import builtin_registry
from activities.tools.settings import ToolSettings

IN_ACCESS, IN_MODIFY, IN_ATTRIB = 0x1, 0x2, 0x4
IN_OPEN, IN_MOVED_FROM, IN_MOVED_TO = 0x20, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
DIR_MASK = (
    IN_OPEN
    | IN_ACCESS
    | IN_MODIFY
    | IN_ATTRIB
    | IN_CREATE
    | IN_DELETE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
FILE_MASK = IN_ACCESS | IN_MODIFY | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF

SETTINGS = ToolSettings(kill_grace=0.3, progress_interval=0.05, output_cap=4000)


class Inotify:
    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.names: dict[int, str] = {}

    def watch(self, path: Path, mask: int) -> None:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.names[wd] = str(path)

    def events(self) -> list[tuple[str, int, str]]:
        found: list[tuple[str, int, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode()
                found.append((self.names.get(wd, "?"), mask, name))
                offset += 16 + length

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Sandbox:
    """A workspace and, next to it, an outside directory holding secrets that must stay put."""

    workspace: Path
    outside: Path
    secret: str
    settings: ToolSettings = SETTINGS
    inotify: Inotify | None = None
    before: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    progress: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    def context(self) -> ToolContext:
        async def progress(structured: dict[str, Any], text: str) -> None:
            self.progress.append((structured, text))

        return ToolContext("ses_test", self.workspace, "msg_test", "call_test", progress)

    def tool(self, name: str) -> Tool[Any]:
        tool = builtin_registry(self.settings).get(name)
        assert tool is not None
        return tool

    async def call(self, name: str, **arguments: Any) -> ToolOutput:
        tool = self.tool(name)
        return await tool.execute(tool.input_model.model_validate(arguments), self.context())

    def state(self) -> dict[str, tuple[bytes, int]]:
        found = {}
        for path in sorted(self.outside.rglob("*")):
            st = path.lstat()
            body = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            found[str(path)] = (body, st.st_mtime_ns)
        return found

    def arm(self) -> None:
        """Start auditing: what is outside now must be exactly what is outside at the end."""
        self.before = self.state()
        self.inotify = Inotify()
        for path in [self.outside, *self.outside.rglob("*")]:
            self.inotify.watch(path, DIR_MASK if path.is_dir() else FILE_MASK)

    def touched(self) -> list[tuple[str, int, str]]:
        assert self.inotify is not None
        return self.inotify.events()

    def assert_untouched(self) -> None:
        events = self.touched()
        after = self.state()
        self.touched()  # our own reads, just now
        assert events == [], "something outside the workspace was opened or changed"
        assert after == self.before


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    workspace = tmp_path / "workspace"
    outside = tmp_path / "outside"
    workspace.mkdir()
    (outside / "dir").mkdir(parents=True)
    secret = f"TOPSECRET-{uuid.uuid4().hex}"
    (outside / "secret.txt").write_text(secret + "\n")
    (outside / "dir" / "f.txt").write_text(secret + "\n")
    box = Sandbox(workspace, outside, secret)
    yield box
    if box.inotify is not None:
        box.inotify.close()


def text(output: ToolOutput) -> str:
    return "".join(getattr(part, "text", "") for part in output.content)
