"""``read``, ``write`` and ``edit``: one file inside the workspace (see ``paths.py``).

``write`` and ``edit`` return the workspace-relative path they changed in ``output_paths``;
``run_tool`` records it with ``tool.success`` and the step's ``files`` are the union of those
(``changes.step_files``). Neither is safe to re-run blindly: ``edit`` applied twice is a
different edit, and a ``write`` may race a later one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import BinaryIO

from pydantic import BaseModel, Field

from activities.tools.base import Tool, ToolContext, ToolFailure, ToolOutput
from activities.tools.output import normalize, text_output
from activities.tools.paths import Workspace
from activities.tools.settings import ToolSettings

_SNIFF_BYTES = 8192


def looks_binary(sample: bytes) -> bool:
    """NUL bytes, or more than a tenth of the sample not decoding as UTF-8."""
    if b"\0" in sample:
        return True
    text = sample.decode("utf-8", "replace")
    return text.count("\ufffd") > max(len(text) // 10, 4)


def _lines(file: BinaryIO, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Lines (without their ending) and whether each was cut; a huge line is never held whole."""
    while chunk := file.readline(max_bytes):
        cut = len(chunk) == max_bytes and not chunk.endswith(b"\n")
        while cut and (rest := file.readline(max_bytes)) and not rest.endswith(b"\n"):
            pass
        yield chunk.rstrip(b"\n").rstrip(b"\r"), cut


def _line_text(raw: bytes, cut: bool, chars: int) -> str:
    text = normalize(raw)
    if cut or len(text) > chars:
        return text[:chars] + " … [line truncated]"
    return text


def encode_text(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as error:
        raise ToolFailure(f"{what} is not valid Unicode at index {error.start}") from None


def rewrite(fd: int, data: bytes) -> None:
    """Replace a file's contents in place: never empty in between, same inode, same links."""
    view = memoryview(data)
    offset = 0
    while offset < len(data):
        offset += os.pwrite(fd, view[offset:], offset)
    os.ftruncate(fd, len(data))


class ReadInput(BaseModel):
    path: str = Field(description="File path, relative to the workspace root")
    offset: int = Field(default=1, ge=1, description="First line to return (1-based)")
    limit: int | None = Field(default=None, ge=1, description="How many lines (default 2000)")


class Read(Tool[ReadInput]):
    name = "read"
    description = (
        "Read a text file of the workspace. Returns numbered lines; use offset and limit for "
        "long files. Binary files are refused."
    )
    input_model = ReadInput
    retry_safe = True

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: ReadInput, context: ToolContext) -> ToolOutput:
        return await asyncio.to_thread(self._read, input, str(context.workspace))

    def _read(self, input: ReadInput, root: str) -> ToolOutput:
        with Workspace(root, self.settings) as workspace:
            opened = workspace.open_file(input.path)
            with os.fdopen(opened.fd, "rb") as file:
                if looks_binary(file.read(_SNIFF_BYTES)):
                    size = opened.st.st_size
                    raise ToolFailure(f"{opened.rel} is a binary file ({size} bytes); not shown")
                file.seek(0)
                return self._window(file, opened.rel, input)

    def _window(self, file: BinaryIO, rel: str, input: ReadInput) -> ToolOutput:
        limit = input.limit or self.settings.read_lines
        budget = self.settings.output_cap
        chars = self.settings.line_chars
        shown: list[str] = []
        used, number, more = 0, 0, False
        for number, (raw, cut) in enumerate(_lines(file, chars * 4), start=1):
            if number < input.offset:
                continue
            line = f"{number:>6}\t{_line_text(raw, cut, chars)}"
            size = len(line.encode("utf-8")) + 1
            if len(shown) >= limit or (shown and used + size > budget):
                more = True
                break
            shown.append(line)
            used += size
        return self._render(rel, input.offset, shown, number, more)

    def _render(self, rel: str, offset: int, shown: list[str], last: int, more: bool) -> ToolOutput:
        if not shown and offset > 1:
            raise ToolFailure(f"offset {offset} is past the end of {rel} ({last} lines)")
        body = "\n".join(shown) if shown else "(empty file)"
        next_offset = offset + len(shown) if more else None
        footer = f"\n… more lines follow; continue with offset={next_offset}" if more else ""
        return text_output(
            body,
            self.settings.output_cap,
            suffix=footer,
            path=rel,
            offset=offset,
            lines=len(shown),
            next_offset=next_offset,
        )


class WriteInput(BaseModel):
    path: str = Field(description="File path, relative to the workspace root")
    content: str = Field(description="The whole new content of the file")


class Write(Tool[WriteInput]):
    name = "write"
    description = (
        "Write a file of the workspace, replacing its content; missing parent directories are "
        "created."
    )
    input_model = WriteInput
    retry_safe = False

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: WriteInput, context: ToolContext) -> ToolOutput:
        return await asyncio.to_thread(self._write, input, str(context.workspace))

    def touches(self, input: WriteInput) -> tuple[str, ...]:
        return (input.path,)

    def _write(self, input: WriteInput, root: str) -> ToolOutput:
        data = encode_text(input.content, "content")
        with Workspace(root, self.settings) as workspace:
            opened = workspace.open_file(input.path, write=True, create=True, create_dirs=True)
            try:
                rewrite(opened.fd, data)
            finally:
                os.close(opened.fd)
        message = f"Wrote {len(data)} bytes to {opened.rel}"
        return text_output(
            message, self.settings.output_cap, paths=(opened.rel,), path=opened.rel, bytes=len(data)
        )


class EditInput(BaseModel):
    path: str = Field(description="File path, relative to the workspace root")
    old_string: str = Field(min_length=1, description="Exact text to replace")
    new_string: str = Field(description="Replacement text")
    replace_all: bool = Field(default=False, description="Replace every occurrence")


class Edit(Tool[EditInput]):
    name = "edit"
    description = (
        "Replace exact text in a file of the workspace. old_string must match exactly once "
        "(whitespace included) unless replace_all is true."
    )
    input_model = EditInput
    retry_safe = False

    def __init__(self, settings: ToolSettings | None = None) -> None:
        self.settings = settings or ToolSettings()

    async def execute(self, input: EditInput, context: ToolContext) -> ToolOutput:
        return await asyncio.to_thread(self._edit, input, str(context.workspace))

    def touches(self, input: EditInput) -> tuple[str, ...]:
        return (input.path,)

    def _edit(self, input: EditInput, root: str) -> ToolOutput:
        if input.old_string == input.new_string:
            raise ToolFailure("old_string and new_string are identical; nothing to change")
        with Workspace(root, self.settings) as workspace:
            opened = workspace.open_file(input.path, write=True)
            try:
                count = self._apply(opened.fd, opened.rel, opened.st.st_size, input)
            finally:
                os.close(opened.fd)
        message = f"Edited {opened.rel}: {count} replacement{'s' if count > 1 else ''}"
        return text_output(
            message,
            self.settings.output_cap,
            paths=(opened.rel,),
            path=opened.rel,
            replacements=count,
        )

    def _apply(self, fd: int, rel: str, size: int, input: EditInput) -> int:
        if size > self.settings.max_file_bytes:
            raise ToolFailure(f"{rel} is {size} bytes, over the edit limit; use bash")
        data = os.pread(fd, size, 0)
        if b"\0" in data:
            raise ToolFailure(f"{rel} is a binary file; edit changes text files only")
        # surrogateescape: bytes that are not UTF-8 elsewhere in the file are written back as is.
        text = data.decode("utf-8", "surrogateescape")
        old, new = _line_endings(text, input.old_string, input.new_string)
        count = text.count(old)
        if count == 0:
            raise ToolFailure(
                f"old_string was not found in {rel}; read the file and copy the text exactly, "
                f"including whitespace and indentation"
            )
        if count > 1 and not input.replace_all:
            raise ToolFailure(
                f"old_string matches {count} places in {rel}; include more surrounding lines "
                f"to make it unique, or set replace_all to true"
            )
        updated = text.replace(old, new) if input.replace_all else text.replace(old, new, 1)
        rewrite(fd, encode_text(updated, "new_string"))
        return count


def _line_endings(text: str, old: str, new: str) -> tuple[str, str]:
    """Models write ``\\n``: a CRLF file keeps its endings when that is the only way to match."""
    if old in text or "\r\n" not in text or "\n" not in old:
        return old, new
    crlf = old.replace("\r\n", "\n").replace("\n", "\r\n")
    if crlf not in text:
        return old, new
    return crlf, new.replace("\r\n", "\n").replace("\n", "\r\n")
