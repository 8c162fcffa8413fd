"""``sessionflow demo`` (and ``make demo``): a live session on the embedded default.

It starts the Temporal dev server if none answers, runs a worker in this process on the SQLite
store in the nearest ``.sessionflow/``, creates a session in a fresh temporary workspace with a
scripted model that calls five tools at once (list, read three files, a shell command), streams
the session live, and prints the session id and the Temporal UI link to its workflow.
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from sessionflow.api.serve import dev_api
from sessionflow.client import SessionClient
from sessionflow.devstack import StackOptions, ensure_server, state_file
from sessionflow.models.drain import workflow_id
from sessionflow.settings import Settings
from sessionflow.watch import TERMINALS, Renderer

DEMO_QUEUE = "sessionflow-demo"
FILES = {
    "app.py": "from util import greet\n\n\ndef main() -> None:\n    print(greet('world'))\n",
    "util.py": "def greet(name: str) -> str:\n    return f'Hello, {name}!'\n",
    "NOTES.md": "# Notes\n\n- `app.py` prints a greeting using `util.greet`.\n",
}


def _call(call_id: str, name: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool_call": {"id": call_id, "name": name, "input": tool_input}}


def demo_script() -> dict[str, Any]:
    """Turn 1 looks around with five tools at once; turn 2 answers from what they returned."""
    return {
        "turns": [
            {
                "events": [
                    {
                        "reasoning": "Look at the whole workspace before answering.",
                        "chunks": 6,
                        "delay_ms": 25,
                    },
                    {
                        "text": "Let me look around the workspace first.",
                        "chunks": 8,
                        "delay_ms": 30,
                    },
                    _call("call_list", "list", path="."),
                    _call("call_app", "read", path="app.py"),
                    _call("call_util", "read", path="util.py"),
                    _call("call_notes", "read", path="NOTES.md"),
                    _call("call_wc", "bash", command="wc -l *.py *.md"),
                    {"finish": {"reason": "tool-calls", "usage": {"input": 420, "output": 96}}},
                ]
            },
            {
                "events": [
                    {
                        "text": (
                            "This is a tiny Python project: `app.py` calls `util.greet` to print "
                            "'Hello, world!', and NOTES.md documents it. All five tools ran in "
                            "parallel, each recorded durably in the event store."
                        ),
                        "chunks": 24,
                        "delay_ms": 30,
                    },
                    {"finish": {"reason": "stop", "usage": {"input": 980, "output": 61}}},
                ]
            },
        ]
    }


async def run_demo(console: Console, options: StackOptions) -> None:
    """Run the demo: the dev server (reused or started), a worker in this process, a session."""
    from sessionflow.logs import quiet_expected_failures
    from store import open_store
    from worker import build_worker, demo_tools

    quiet_expected_failures()
    log_file = _log_to_file(options.state_dir)
    server, temporal = await ensure_server(
        options.address, ui_port=options.ui_port, state_dir=options.state_dir
    )
    started = "started" if server.pid else "already running"
    console.print(f"[dim]Temporal dev server {started} at {server.address}; UI {server.ui}[/]")
    console.print(f"[dim]store {options.database_url}; worker log {log_file}[/]", soft_wrap=True)
    store = await open_store(options.database_url, settings=Settings.from_env())
    workspace = Path(tempfile.mkdtemp(prefix="sessionflow-demo-"))
    for name, text in FILES.items():
        (workspace / name).write_text(text)
    options.state_dir.mkdir(parents=True, exist_ok=True)
    script = options.state_dir / "demo-model.json"
    script.write_text(json.dumps(demo_script(), indent=2))
    task_queue = options.task_queue or DEMO_QUEUE
    client = SessionClient(temporal, store, task_queue=task_queue)
    try:
        async with (
            build_worker(temporal, store, task_queue=task_queue, tools=demo_tools()),
            dev_api(temporal, store, task_queue=task_queue, temporal_ui=server.ui_url or "") as api,
        ):
            session_id = await client.create_session(
                workspace=str(workspace), model=f"scripted/{script}", title="demo"
            )
            console.print(f"[bold]session[/] {session_id}  [dim]workspace {workspace}[/]")
            page = f"{api}/view/{session_id}"
            console.print(
                f"[bold]live page[/] {page} [dim](while the demo runs)[/]", soft_wrap=True
            )
            await client.prompt(session_id, "What is in this workspace?")
            outcome = await _stream(console, client, session_id)
    finally:
        await store.close()
    console.print()
    console.print(f"[bold]session id[/]   {session_id}", soft_wrap=True)
    link = server.workflow_link(workflow_id(session_id))
    console.print(f"[bold]Temporal UI[/]  {link}", soft_wrap=True, highlight=False)
    console.print(f"[dim]find it there with: SessionId = '{session_id}'[/]", soft_wrap=True)
    console.print(
        f"[dim]the live page closed with the demo; `sessionflow dev` from here serves it again "
        f"(its API's port, by default the same: {page})[/]",
        soft_wrap=True,
    )
    if server.pid:
        pid_file = state_file(options.state_dir, options.port, "pid")
        console.print(f"[dim]the dev server keeps running; stop it: kill $(cat {pid_file})[/]")
    if outcome != "session.execution.succeeded":
        raise RuntimeError(f"the demo session ended with {outcome}")


def _log_to_file(state_dir: Path) -> Path:
    """The in-process worker's log lines go to a file: on the terminal they would land in the
    middle of the streamed text."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "demo.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    return path


async def _stream(console: Console, client: SessionClient, session_id: str) -> str:
    renderer = Renderer(console)
    try:
        async for event in client.events(session_id, follow=True):
            renderer.render(event)
            if event.type in TERMINALS:
                return event.type
    finally:
        renderer.close()
    raise RuntimeError("the event stream ended early")


if __name__ == "__main__":
    from sessionflow.cli import app

    app(["demo"])
