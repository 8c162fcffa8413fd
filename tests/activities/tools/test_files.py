"""``read``, ``write`` and ``edit``: behaviour and the errors the model reads."""

from __future__ import annotations

import dataclasses

import pytest

from activities.tools.base import ToolFailure
from tests.activities.tools.conftest import Sandbox, text


@pytest.fixture
def files(sandbox: Sandbox) -> Sandbox:
    ws = sandbox.workspace
    (ws / "ten.txt").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    (ws / "crlf.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    (ws / "empty.txt").write_bytes(b"")
    (ws / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (ws / "latin1.txt").write_bytes(b"caf\xe9 ok\n")
    (ws / "ansi.txt").write_bytes(b"\x1b[31mred\x1b[0m \x1b]0;title\x07tail\n")
    return sandbox


async def test_read_numbers_lines(files: Sandbox) -> None:
    output = await files.call("read", path="ten.txt")
    lines = text(output).splitlines()
    assert lines[0] == "     1\tline 1" and lines[-1] == "    10\tline 10"
    assert output.structured == {"path": "ten.txt", "offset": 1, "lines": 10, "next_offset": None}
    assert output.output_paths == ()


async def test_read_line_ranges_say_where_to_continue(files: Sandbox) -> None:
    output = await files.call("read", path="ten.txt", offset=4, limit=3)
    body = text(output)
    assert body.splitlines()[:3] == ["     4\tline 4", "     5\tline 5", "     6\tline 6"]
    assert "continue with offset=7" in body
    assert output.structured["next_offset"] == 7
    tail = await files.call("read", path="ten.txt", offset=9)
    assert text(tail).splitlines() == ["     9\tline 9", "    10\tline 10"]


async def test_read_past_the_end_and_empty_files(files: Sandbox) -> None:
    with pytest.raises(ToolFailure, match=r"offset 50 is past the end of ten.txt \(10 lines\)"):
        await files.call("read", path="ten.txt", offset=50)
    assert text(await files.call("read", path="empty.txt")) == "(empty file)"


async def test_read_refuses_binary_and_missing_files(files: Sandbox) -> None:
    with pytest.raises(ToolFailure, match=r"image.png is a binary file"):
        await files.call("read", path="image.png")
    with pytest.raises(ToolFailure, match=r"nope.txt does not exist"):
        await files.call("read", path="nope.txt")
    with pytest.raises(ToolFailure, match="is a directory"):
        await files.call("read", path=".")


async def test_read_normalizes_what_it_shows(files: Sandbox) -> None:
    assert text(await files.call("read", path="crlf.txt")).splitlines()[1] == "     2\ttwo"
    assert "caf\ufffd ok" in text(await files.call("read", path="latin1.txt"))
    assert text(await files.call("read", path="ansi.txt")) == "     1\tred tail"


async def test_read_caps_lines_and_bytes(files: Sandbox) -> None:
    files.settings = dataclasses.replace(files.settings, line_chars=50, output_cap=300)
    (files.workspace / "wide.txt").write_text("x" * 100_000 + "\nnext\n")
    first = text(await files.call("read", path="wide.txt"))
    assert first.splitlines()[0] == "     1\t" + "x" * 50 + " … [line truncated]"
    assert first.splitlines()[1] == "     2\tnext"
    (files.workspace / "long.txt").write_text("".join(f"{n:040d}\n" for n in range(100)))
    capped = await files.call("read", path="long.txt")
    assert len(text(capped).encode()) < 400
    assert capped.structured["next_offset"] == capped.structured["lines"] + 1


async def test_write_creates_parents_and_reports_the_path(files: Sandbox) -> None:
    output = await files.call("write", path="a/b/c.txt", content="héllo\n")
    assert (files.workspace / "a/b/c.txt").read_text() == "héllo\n"
    assert output.output_paths == ("a/b/c.txt",)
    assert output.structured == {"path": "a/b/c.txt", "bytes": 7}
    await files.call("write", path="a/b/c.txt", content="x")
    assert (files.workspace / "a/b/c.txt").read_text() == "x"


async def test_write_keeps_the_inode_and_refuses_lone_surrogates(files: Sandbox) -> None:
    before = (files.workspace / "ten.txt").stat().st_ino
    await files.call("write", path="ten.txt", content="short")
    assert (files.workspace / "ten.txt").stat().st_ino == before
    with pytest.raises(ToolFailure, match="not valid Unicode"):
        await files.call("write", path="bad.txt", content="a\ud800b")
    with pytest.raises(ToolFailure, match="component of the path is not a directory"):
        await files.call("write", path="ten.txt/inner", content="x")


async def test_edit_replaces_exactly_one_match(files: Sandbox) -> None:
    output = await files.call("edit", path="ten.txt", old_string="line 3\n", new_string="three\n")
    assert "three\nline 4" in (files.workspace / "ten.txt").read_text()
    assert output.output_paths == ("ten.txt",)
    assert output.structured["replacements"] == 1


async def test_edit_errors_say_what_to_do(files: Sandbox) -> None:
    with pytest.raises(ToolFailure, match=r"not found in ten.txt"):
        await files.call("edit", path="ten.txt", old_string="absent", new_string="x")
    with pytest.raises(ToolFailure, match=r"matches 10 places in ten.txt.*replace_all"):
        await files.call("edit", path="ten.txt", old_string="line", new_string="row")
    with pytest.raises(ToolFailure, match="identical"):
        await files.call("edit", path="ten.txt", old_string="line", new_string="line")
    with pytest.raises(ToolFailure, match="does not exist"):
        await files.call("edit", path="missing.txt", old_string="a", new_string="b")
    assert not (files.workspace / "missing.txt").exists()
    with pytest.raises(ToolFailure, match="binary"):
        await files.call("edit", path="image.png", old_string="PNG", new_string="GIF")


async def test_edit_all_occurrences_on_request(files: Sandbox) -> None:
    output = await files.call(
        "edit", path="ten.txt", old_string="line", new_string="row", replace_all=True
    )
    assert output.structured["replacements"] == 10
    assert "line" not in (files.workspace / "ten.txt").read_text()


async def test_edit_keeps_crlf_and_undecodable_bytes(files: Sandbox) -> None:
    await files.call("edit", path="crlf.txt", old_string="one\ntwo", new_string="1\n2")
    assert (files.workspace / "crlf.txt").read_bytes() == b"1\r\n2\r\nthree\r\n"
    await files.call("edit", path="latin1.txt", old_string="ok", new_string="fine")
    assert (files.workspace / "latin1.txt").read_bytes() == b"caf\xe9 fine\n"
