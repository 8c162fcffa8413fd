"""``sessionflow demo`` (and ``make demo``): a live session on the embedded default.

It starts the Temporal dev server if none answers, runs a worker in this process on the SQLite
store under ``./.sessionflow/``, creates a session in a fresh temporary workspace with a scripted
model that calls five tools at once (list, read three files, a shell command), streams the session
live, and prints the session id and the Temporal UI link to its workflow.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from sessionflow.api.serve import dev_api
from sessionflow.client import SessionClient
from sessionflow.devstack import ensure_server
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


async def run_demo(console: Console, address: str, *, ui_port: int, state_dir: Path) -> None:
    """Run the demo; ``state_dir`` must be absolute (it holds the store and the script)."""
    from store import open_store
    from worker import build_worker, demo_tools

    server, temporal = await ensure_server(address, ui_port=ui_port, state_dir=state_dir)
    started = "started" if server.pid else "already running"
    console.print(f"[dim]Temporal dev server {started} at {address}; UI {server.ui}[/]")
    settings = Settings.from_env()
    url = os.environ.get("SESSIONFLOW_DATABASE_URL") or (
        f"sqlite+aiosqlite:///{state_dir / 'sessionflow.db'}"
    )
    store = await open_store(url, settings=settings)
    workspace = Path(tempfile.mkdtemp(prefix="sessionflow-demo-"))
    for name, text in FILES.items():
        (workspace / name).write_text(text)
    script = state_dir / "demo-model.json"
    script.write_text(json.dumps(demo_script(), indent=2))
    client = SessionClient(temporal, store, task_queue=DEMO_QUEUE)
    try:
        async with (
            build_worker(temporal, store, task_queue=DEMO_QUEUE, tools=demo_tools()),
            dev_api(temporal, store, task_queue=DEMO_QUEUE, temporal_ui=server.ui) as api,
        ):
            session_id = await client.create_session(
                workspace=str(workspace), model=f"scripted/{script}", title="demo"
            )
            console.print(f"[bold]session[/] {session_id}  [dim]workspace {workspace}[/]")
            console.print(f"[bold]live page[/] {api}/view/{session_id}", soft_wrap=True)
            await client.prompt(session_id, "What is in this workspace?")
            outcome = await _stream(console, client, session_id)
    finally:
        await store.close()
    console.print()
    console.print(f"[bold]session id[/]   {session_id}", soft_wrap=True)
    link = server.workflow_link(workflow_id(session_id))
    console.print(f"[bold]Temporal UI[/]  {link}", soft_wrap=True, highlight=False)
    console.print(f"[dim]find it there with: SessionId = '{session_id}'[/]", soft_wrap=True)
    if outcome != "session.execution.succeeded":
        raise RuntimeError(f"the demo session ended with {outcome}")


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
