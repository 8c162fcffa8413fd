"""The one output normalization and the cap (reference catalogue D1, D2)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activities.tools.output import clip, normalize, text_output
from activities.tools.settings import ToolSettings
from sessionflow.models import events as ev
from store import Store
from tests.activities.tools.conftest import Sandbox, text

HOSTILE_BYTES = (
    b"nul\x00byte bell\x07 backspace\x08 del\x7f"
    b" bad utf8 \xff\xfe\xc3\x28"
    b" csi \x1b[1;31mred\x1b[0m cursor \x1b[2J\x1b[H"
    b" osc \x1b]0;title\x07 link \x1b]8;;http://x\x1b\\text\x1b]8;;\x1b\\"
    b" dcs \x1bPq#0;2;0;0;0\x1b\\ charset \x1b(B"
    b" c1 \xc2\x9b31m"
    b" rtl \xe2\x80\xae override zero\xe2\x80\x8bwidth"
    b" emoji \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb"
    b" combining e\xcc\x81 progress 10%\r20%\r\n"
)


def test_normalization_rule() -> None:
    out = normalize(HOSTILE_BYTES)
    assert "\x00" not in out and "\x1b" not in out and "\x07" not in out and "\x7f" not in out
    assert "nulbyte bell backspace del" in out
    assert "bad utf8 \ufffd\ufffd\ufffd(" in out
    assert "csi red cursor " in out and "osc  link text" in out
    assert "dcs  charset " in out and "c1 m" not in out and " c1 " in out
    assert "\u202e override zero\u200bwidth" in out and "👩\u200d💻" in out
    assert "e\u0301" in out
    assert out.endswith("progress 10%\n20%\n")


def test_lone_surrogates_become_replacement_characters() -> None:
    assert normalize("a\ud800b\udcff") == "a\ufffdb\ufffd"
    name = b"file\xff".decode("utf-8", "surrogateescape")
    assert normalize(name) == "file\ufffd"


@given(st.one_of(st.binary(max_size=200), st.text(max_size=200)))
def test_normalization_is_idempotent_and_storable(data: bytes | str) -> None:
    once = normalize(data)
    assert normalize(once) == once
    once.encode("utf-8")  # no lone surrogate left
    assert not any(ord(char) < 32 and char not in "\t\n" for char in once)


def test_clip_marks_what_was_cut() -> None:
    assert clip("short", 100) == ("short", 0)
    kept, cut = clip("x" * 120, 100)
    assert kept == "x" * 100 + "\n… [truncated: 20 more bytes]" and cut == 20
    kept, cut = clip("é" * 10, 5)  # never half a character
    assert kept.startswith("éé\n") and cut == 16
    assert clip("all here", 100, omitted=500) == ("all here\n… [truncated: 500 more bytes]", 500)


def test_text_output_keeps_the_note_after_the_cap() -> None:
    output = text_output("y\n" * 100, 10, suffix="\n[exit code 1]", paths=("a",), code=1)
    body = text(output)
    assert body.startswith("y\ny\ny\ny\ny\n\n… [truncated: 190 more bytes]")
    assert body.endswith("\n[exit code 1]")
    assert output.structured == {"code": 1, "truncated_bytes": 190}
    assert output.output_paths == ("a",)


@pytest.mark.breaks_invariants("I4")  # the output is published unclaimed
async def test_hostile_command_output_round_trips_through_the_store(
    sandbox: Sandbox, store: Store
) -> None:
    """Catalogue D2: hostile text."""
    script = sandbox.workspace / "hostile.bin"
    script.write_bytes(HOSTILE_BYTES)
    shown = text(await sandbox.call("bash", command="cat hostile.bin"))
    assert shown == normalize(HOSTILE_BYTES)
    session = await store.sessions.create(str(sandbox.workspace))
    await store.events.publish(ev.Synthetic(session_id=session.id, text=shown))
    (message,) = await store.sessions.messages(session.id)
    assert message.text == shown  # type: ignore[union-attr]


@pytest.mark.parametrize("size", [1_000_000, 10_000_000])
async def test_oversized_file_output_is_capped(sandbox: Sandbox, size: int) -> None:
    """Catalogue D1: oversized tool output."""
    (sandbox.workspace / "big.txt").write_bytes(b"z" * size)
    output = await sandbox.call("bash", command="cat big.txt")
    assert len(text(output).encode()) < sandbox.settings.output_cap + 100
    assert output.structured["output_bytes"] == size
    assert output.structured["truncated_bytes"] == size - sandbox.settings.output_cap


HUNDRED_MB = 100_000_000
MARKER = "\n… [truncated: "


@pytest.mark.fault
@pytest.mark.parametrize("kind", ["text", "binary"])
@pytest.mark.breaks_invariants("I4")  # the output is published unclaimed
async def test_100_mb_of_output_is_cut_with_bounded_memory_and_stored_safely(
    tmp_path: Path, store: Store, kind: str
) -> None:
    """Catalogue D1: 100 MB of output from one bash call, text (``yes``) or the ``cat`` of a
    100 MB file of random bytes (invalid UTF-8, NUL bytes, escapes), run as the worker runs it
    in a process of its own. That process's peak RSS grows by less than 2x the output (in fact by
    a bounded amount: the capture keeps the store's cap and counts the rest); the model's view is
    cut at its cap and the store's at its own, each with the marker counting every byte cut; the
    binary view is text, and both views store and read back unchanged on the database."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    if kind == "binary":
        with (workspace / "blob.bin").open("wb") as blob:
            for _ in range(100):
                blob.write(os.urandom(HUNDRED_MB // 100))
    command = "yes | head -c 100000000" if kind == "text" else "cat blob.bin"
    report = tmp_path / "report.json"
    child = [sys.executable, "-m", "tests.activities.tools.output_child"]
    proc = await asyncio.create_subprocess_exec(*child, str(workspace), command, str(report))
    assert await proc.wait() == 0
    result = json.loads(report.read_text())
    grown = result["after"] - result["before"]
    assert grown < 2 * HUNDRED_MB
    assert grown < 64 * 1024 * 1024, f"peak RSS grew {grown / 2**20:.0f} MiB"
    settings = ToolSettings()
    shown, full = result["shown"], result["full_text"]
    assert result["structured"]["output_bytes"] == HUNDRED_MB
    assert MARKER in shown and len(shown.encode()) < settings.output_cap + 100
    assert MARKER in full and len(full.encode()) < settings.store_cap + 100
    assert full.startswith(shown[: shown.index(MARKER)])
    assert normalize(full) == full  # already the one normalization: no NUL, no escape, no byte
    if kind == "binary":
        assert "\ufffd" in full
    session = await store.sessions.create(str(workspace))
    for body in (shown, full):
        await store.events.publish(ev.Synthetic(session_id=session.id, text=body))
    stored = [message.text for message in await store.sessions.messages(session.id)]  # type: ignore[union-attr]
    assert stored == [shown, full]
