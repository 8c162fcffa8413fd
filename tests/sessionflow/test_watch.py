"""The terminal renderer: live text, tools with durations, a live table of running tools."""

from __future__ import annotations

import io
import re

from rich.console import Console

from sessionflow.client import ClientEvent
from sessionflow.watch import Renderer


def event(seq: int, type: str, **data: object) -> ClientEvent:
    return ClientEvent(seq=seq, id=f"evt_{seq}", type=type, created=0, data=dict(data))


def render(terminal: bool, *events: ClientEvent) -> str:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100, color_system=None)
    renderer = Renderer(console)
    for item in events:
        renderer.render(item)
    renderer.close()
    return out.getvalue()


SESSION = [
    event(0, "session.prompt.admitted", input_id="msg_1", prompt={"text": "hello"}),
    event(1, "session.prompt.promoted", input_id="msg_1"),
    event(2, "session.step.started", model={"provider_id": "scripted", "id": "m.json"}),
    event(3, "session.text.delta", delta="Let me "),
    event(4, "session.tool.called", call_id="c1", name="read", input={"path": "a.py"}),
    event(5, "session.text.delta", delta="look.\nMore"),
    event(6, "session.tool.success", call_id="c1"),
    event(7, "session.text.ended"),
    event(8, "session.step.ended", finish="stop", tokens={"input": 3, "output": 4}, cost=0.5),
]


def test_plain_output_streams_text_and_tools() -> None:
    text = render(False, *SESSION)
    assert "you hello" in text
    assert "Let me" in text and "look." in text and "More" in text
    assert "▶ read" in text and "✓ read" in text
    assert "stop · 3 in / 4 out · $0.5000" in text


def test_a_terminal_gets_a_live_table_and_loses_no_text() -> None:
    text = render(True, *SESSION)
    assert re.search(r"read \d+\.\d s", text)  # the running-tools table: name and duration
    assert "look." in text and "More" in text and "✓ read" in text
    assert "Let me" in text
    assert "read" not in render(False, *SESSION).split("✓ read")[0].split("▶ read")[1]


def test_the_restart_line_shows_as_in_show() -> None:
    """Issue 32: after a kill -9, ``watch`` showed the failed step but not that it went on."""
    from activities.restart import restart_message

    restart = restart_message("ses_1")
    lost = {
        "type": "aborted",
        "message": "Step interrupted: its worker stopped answering; continued",
    }
    text = render(
        False,
        event(0, "session.step.failed", error=lost),
        event(1, "session.synthetic", text=restart.text, description=restart.description),
    )
    assert "step failed aborted Step interrupted: its worker stopped answering; continued" in text
    assert "↻ Continuing after restart The server restarted while you were working." in text
