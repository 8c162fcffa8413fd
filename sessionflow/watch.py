"""Render a session's stored events in a terminal (or as JSON lines for scripts)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from sessionflow.client import ClientEvent

TERMINALS = frozenset(
    {
        "session.execution.succeeded",
        "session.execution.failed",
        "session.execution.interrupted",
    }
)


OUTPUT_LINES = 5  # tool output lines shown under a settled call unless --full


def output_text(data: dict[str, Any]) -> str:
    """The text parts of a tool result or progress event, joined."""
    parts = data.get("content") or ()
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


PROMPT_CHARS = 2000  # a prompt longer than this is cut, with a marker, unless --full


def cut(text: str) -> str:
    """``text``, cut after ``PROMPT_CHARS`` characters with a marker saying how much is left."""
    if len(text) <= PROMPT_CHARS:
        return text
    return f"{text[:PROMPT_CHARS]}… [{len(text) - PROMPT_CHARS} more characters; --full shows all]"


def clip(text: str, lines: int | None) -> tuple[list[str], int]:
    """The first ``lines`` lines of ``text`` (all when None) and how many were left out."""
    every = text.rstrip("\n").split("\n") if text.strip() else []
    if lines is None or len(every) <= lines:
        return every, 0
    return every[:lines], len(every) - lines


class RunningTools:
    """A live table of the tools still running: a spinner, the tool, how long it has run.

    Start times are the ``tool.called`` events' own stamps (ms), so a replayed call shows how
    long it has really been running, not how long ago it was rendered."""

    def __init__(self, tools: dict[str, tuple[str, float]]) -> None:
        self.tools = tools
        self.spinners: dict[str, Spinner] = {}

    def __rich__(self) -> RenderableType:
        table = Table.grid(padding=(0, 1))
        now = time.time() * 1000
        for call_id, (name, started) in self.tools.items():
            spinner = self.spinners.setdefault(call_id, Spinner("dots", style="yellow"))
            seconds = max(0.0, now - started) / 1000
            table.add_row(spinner, Text(name), Text(f"{seconds:.1f} s", style="dim"))
        return Group(table)


class Renderer:
    """Streams text as it arrives, reasoning dimmed, tools with their durations (from the
    events' stamps) and the first lines of their output (all of it with ``full``), step usage.

    On a terminal, running tools also show in a live table (spinners and durations) below the
    stream; elsewhere (pipes, logs) everything is plain lines.
    """

    def __init__(self, console: Console, *, as_json: bool = False, full: bool = False) -> None:
        self.console = console
        self.as_json = as_json
        self.full = full
        self.output_lines: int | None = None if full else OUTPUT_LINES
        self.created = 0
        self.prompts: dict[str, str] = {}
        self.tools: dict[str, tuple[str, float]] = {}
        self.open_line = False
        self.live: Live | None = None
        self.held = ""

    def _show_running(self) -> None:
        if not self.console.is_terminal or self.as_json:
            return
        if self.tools and self.live is None:
            self._end_line()
            self.live = Live(
                RunningTools(self.tools), console=self.console, refresh_per_second=8, transient=True
            )
            self.live.start()
        elif not self.tools and self.live is not None:
            self.close()

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.held:
            held, self.held = self.held, ""
            self._write(held)

    def render(self, event: ClientEvent) -> None:
        if self.as_json:
            record = {
                "seq": event.seq,
                "id": event.id,
                "type": event.type,
                "created": event.created,
            }
            print(json.dumps({**record, "data": event.data}, ensure_ascii=False), flush=True)
            return
        self.created = event.created
        handler = getattr(self, "_" + event.type.removeprefix("session.").replace(".", "_"), None)
        if handler is not None:
            handler(event.data)

    def _write(self, text: str, style: str | None = None) -> None:
        if self.live is not None:
            # Above a live table only whole lines print cleanly: hold the partial one.
            self.held += text
            *lines, self.held = self.held.split("\n")
            for line in lines:
                self.console.print(line, style=style, markup=False, highlight=False)
            return
        self.console.print(text, style=style, end="", markup=False, highlight=False)
        self.open_line = not text.endswith("\n")

    def _line(self, markup: str) -> None:
        if self.open_line:
            self.console.print()
            self.open_line = False
        self.console.print(markup, highlight=False)

    def _prompt_admitted(self, data: dict[str, Any]) -> None:
        self.prompts[data["input_id"]] = data["prompt"]["text"]

    def _prompt_promoted(self, data: dict[str, Any]) -> None:
        text = self.prompts.get(data["input_id"], "")
        self._line(f"[bold cyan]you[/] {escape(text if self.full else cut(text))}")

    def _reverted(self, data: dict[str, Any]) -> None:
        paths = ", ".join(escape(p["path"]) for p in data["paths"][:10]) or "no file"
        self._line(f"[bold yellow]reverted[/] to {escape(data['message_id'])}: {paths}")

    def _unreverted(self, data: dict[str, Any]) -> None:
        paths = ", ".join(escape(p["path"]) for p in data["paths"][:10]) or "no file"
        self._line(f"[bold yellow]unreverted[/] {escape(data['message_id'])}: {paths}")

    def _forked(self, data: dict[str, Any]) -> None:
        where = f"{escape(data['fork_session_id'])} in {escape(data['directory'])}"
        self._line(f"[bold yellow]forked[/] at {escape(data['message_id'])}: {where}")

    def _message_copied(self, data: dict[str, Any]) -> None:
        """A fork's history, as its source's watch showed it (prompts and answers)."""
        message = data["message"]
        if message["type"] == "user":
            text = message["text"]
            self._line(f"[bold cyan]you[/] {escape(text if self.full else cut(text))}")
        elif message["type"] == "assistant":
            model = message["model"]
            self._line(f"[bold magenta]assistant[/] [dim]{model['provider_id']}/{model['id']}[/]")
            for part in message["content"]:
                if part["type"] == "text":
                    self._write(part["text"] + "\n")
                elif part["type"] == "tool":
                    self._line(f"[dim]tool {escape(part['name'])}: {part['state']['status']}[/]")

    def _step_started(self, data: dict[str, Any]) -> None:
        model = data["model"]
        self._line(f"[bold magenta]assistant[/] [dim]{model['provider_id']}/{model['id']}[/]")

    def _text_delta(self, data: dict[str, Any]) -> None:
        self._write(data["delta"])

    def _reasoning_delta(self, data: dict[str, Any]) -> None:
        self._write(data["delta"], style="dim italic")

    def _text_ended(self, data: dict[str, Any]) -> None:
        self._end_line()

    def _reasoning_ended(self, data: dict[str, Any]) -> None:
        self._end_line()

    def _end_line(self) -> None:
        if self.open_line:
            self.console.print()
            self.open_line = False

    def _tool_called(self, data: dict[str, Any]) -> None:
        self.tools[data["call_id"]] = (data["name"], float(self.created))
        summary = json.dumps(data["input"], ensure_ascii=False)
        summary = summary if len(summary) <= 80 else summary[:77] + "..."
        hosted = " [dim](provider)[/]" if data.get("executed") else ""
        self._line(f"[yellow]▶ {escape(data['name'])}[/]{hosted} [dim]{escape(summary)}[/]")
        self._show_running()

    def _tool_success(self, data: dict[str, Any]) -> None:
        name, elapsed = self._finished(data["call_id"])
        self._line(f"[green]✓ {escape(name)}[/] [dim]{elapsed}[/]")
        self._output(output_text(data))

    def _tool_progress(self, data: dict[str, Any]) -> None:
        name = self.tools.get(data["call_id"], (data["call_id"], 0.0))[0]
        shown, _ = clip(output_text(data), 1)
        detail = shown[0] if shown else json.dumps(data.get("structured") or {})
        self._line(f"[dim]… {escape(name)} {escape(detail)}[/]")

    def _output(self, text: str) -> None:
        shown, hidden = clip(text, self.output_lines)
        for line in shown:
            self._line(f"[dim]  │ {escape(line)}[/]")
        if hidden:
            self._line(f"[dim]  │ … {hidden} more line(s); --full shows all[/]")

    def _tool_failed(self, data: dict[str, Any]) -> None:
        name, elapsed = self._finished(data["call_id"])
        error = data["error"]
        self._line(f"[red]✗ {escape(name)}[/] [dim]{elapsed}[/] {escape(error['message'])}")

    def _finished(self, call_id: str) -> tuple[str, str]:
        name, started = self.tools.pop(call_id, (call_id, float(self.created)))
        self._show_running()
        return name, _duration(self.created - started)

    def _step_ended(self, data: dict[str, Any]) -> None:
        tokens = data.get("tokens") or {}
        cost = data.get("cost")
        price = "cost unknown" if cost is None else f"${cost:.4f}"
        self._line(
            f"[dim]· {data['finish']} · {tokens.get('input', 0)} in / {tokens.get('output', 0)} "
            f"out · {price}[/]"
        )

    def _step_failed(self, data: dict[str, Any]) -> None:
        error = data["error"]
        self._line(f"[red]step failed[/] [dim]{error['type']}[/] {escape(error['message'])}")

    def _compaction_started(self, data: dict[str, Any]) -> None:
        why = "manual" if data.get("input_id") else "auto"
        self._line(f"[bold yellow]compacting[/] [dim]({why}): the summary as it is written[/]")

    def _compaction_delta(self, data: dict[str, Any]) -> None:
        self._write(data["delta"], style="dim")

    def _compaction_ended(self, data: dict[str, Any]) -> None:
        self._end_line()
        self._line(
            f"[yellow]✓ compacted[/] [dim]{len(data.get('summary', ''))} characters of summary[/]"
        )

    def _compaction_failed(self, data: dict[str, Any]) -> None:
        self._end_line()
        error = data.get("error") or {}
        self._line(f"[red]compaction failed[/] {escape(str(error.get('message', '')))}")

    def _instructions_updated(self, data: dict[str, Any]) -> None:
        first = (str(data.get("text", "")).splitlines() or [""])[0]
        self._line(f"[dim]system[/] {escape(first)}")

    def _permission_asked(self, data: dict[str, Any]) -> None:
        request = data.get("request") or {}
        rid = escape(str(request.get("request_id", "?")))
        if request.get("kind") == "question":
            asked = escape(str(request.get("question") or request.get("summary", "")))
            options = ", ".join(request.get("options") or ())
            asked += f" ({escape(options)})" if options else ""
            self._line(f"[magenta]? question[/] {asked} [dim]{rid}[/]")
        else:
            tool, summary = (
                escape(str(request.get("tool", "?"))),
                escape(request.get("summary", "")),
            )
            self._line(f"[magenta]? {tool} asks[/] {summary} [dim]{rid}[/]")

    def _permission_replied(self, data: dict[str, Any]) -> None:
        said = f": {data['answer']}" if data.get("answer") else ""
        said += f" by {data['by']}" if data.get("by") else ""
        decision, rid = escape(str(data.get("decision"))), escape(str(data.get("request_id")))
        self._line(f"[magenta]  {decision}[/]{escape(said)} [dim]{rid}[/]")

    def _retry_scheduled(self, data: dict[str, Any]) -> None:
        self._line(
            f"[yellow]retrying[/] attempt {data['attempt']}: {escape(data['error']['message'])}"
        )

    def _todo_updated(self, data: dict[str, Any]) -> None:
        """The session's todo list, whole, as a ``todowrite`` left it."""
        todos = data.get("todos") or []
        done = sum(todo.get("status") == "completed" for todo in todos)
        self._line(f"[cyan]☰ todo[/] {done}/{len(todos)} completed")
        marks = {
            "completed": "[green]✓[/]",
            "in_progress": "[yellow]▸[/]",
            "cancelled": "[dim]✗[/]",
        }
        for todo in todos:
            mark = marks.get(str(todo.get("status")), "[dim]○[/]")
            self._line(f"  {mark} {escape(str(todo.get('content', '')))}")

    def _synthetic(self, data: dict[str, Any]) -> None:
        """What the session told the model itself: after a lost turn, that it continues."""
        what = data.get("description") or "note to the model"
        self._line(f"[yellow]↻ {escape(what)}[/] [dim]{escape(cut(data['text']))}[/]")

    def _execution_succeeded(self, data: dict[str, Any]) -> None:
        self._line("[green]● idle[/]")

    def _execution_failed(self, data: dict[str, Any]) -> None:
        self._line(f"[red]● failed[/] {escape(data['error']['message'])}")

    def _execution_interrupted(self, data: dict[str, Any]) -> None:
        self._line(f"[yellow]● interrupted[/] ({escape(data.get('reason') or 'user')})")


_TODO_MARKS = {"completed": "[green]✓[/]", "in_progress": "[yellow]▸[/]", "cancelled": "[dim]✗[/]"}


def _duration(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"
