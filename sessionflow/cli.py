"""The ``sessionflow`` command line (typer + rich).

Exit codes: 0 success; 1 a user error (unknown session, bad model reference, missing
workspace, bad input); 2 no Temporal server or database reachable; 3 the session's busy
period failed or was interrupted (``resume``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from sessionflow import cli_answers, telemetry
from sessionflow.client import Interruption, SessionClient
from sessionflow.errors import SessionflowError
from sessionflow.models.common import Delivery
from sessionflow.models.drain import TASK_QUEUE
from sessionflow.settings import Settings
from sessionflow.watch import TERMINALS, Renderer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Durable agent sessions.")
console = Console()
errors = Console(stderr=True)
T = TypeVar("T")

USER_ERROR, UNREACHABLE, SESSION_FAILED = 1, 2, 3


class Options:
    address: str = os.environ.get("SESSIONFLOW_TEMPORAL_ADDRESS", "127.0.0.1:7233")
    database_url: str | None = None
    task_queue: str = os.environ.get("SESSIONFLOW_TASK_QUEUE", TASK_QUEUE)


@app.callback()
def main(
    temporal: str = typer.Option(Options.address, "--temporal", help="Temporal address"),
    database: str = typer.Option(None, "--database", help="Store URL (default from settings)"),
    task_queue: str = typer.Option(Options.task_queue, "--task-queue"),
) -> None:
    Options.address, Options.database_url, Options.task_queue = temporal, database, task_queue


def fail(message: str, code: int = USER_ERROR) -> typer.Exit:
    errors.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    try:
        return asyncio.run(work())
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except SessionflowError as error:
        raise fail(str(error)) from None
    except ValueError as error:
        raise fail(str(error)) from None
    except (ConnectionError, OSError, RuntimeError) as error:
        raise fail(
            f"cannot reach Temporal at {Options.address} or the store: {error}. "
            f"Start the embedded stack with `sessionflow dev`, or pass --temporal.",
            UNREACHABLE,
        ) from None


@asynccontextmanager
async def session_client() -> AsyncIterator[SessionClient]:
    from sessionflow.devstack import connect

    telemetry.configure(Settings.from_env().otel_exporter)
    temporal = await connect(Options.address, seconds=5)
    if temporal is None:
        raise fail(
            f"no Temporal server at {Options.address}. "
            f"Start one with `sessionflow dev`, or pass --temporal HOST:PORT.",
            UNREACHABLE,
        )
    client = await SessionClient.connect(
        client=temporal, database_url=Options.database_url, task_queue=Options.task_queue
    )
    try:
        yield client
    finally:
        await client.close()


def emit(value: Any, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(value, ensure_ascii=False, default=str))
    else:
        console.print(text, highlight=False)


# --- sessions -----------------------------------------------------------------------------------


@app.command()
def new(
    workspace: Path = typer.Option(..., "--workspace", help="Directory the tools work in"),
    model: str = typer.Option(..., "--model", help="e.g. scripted/path/to/script.json"),
    title: str = typer.Option("", "--title"),
    max_active_tools: int = typer.Option(8, "--max-active-tools"),
    max_steps: int = typer.Option(None, "--max-steps"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Create a session and print its id."""
    if not workspace.is_dir():
        raise fail(f"workspace {workspace} does not exist: create it or pass another --workspace")

    directory = str(workspace.resolve())

    async def work() -> str:
        async with session_client() as client:
            return await client.create_session(
                workspace=directory,
                model=model,
                title=title,
                max_active_tools=max_active_tools,
                max_steps=max_steps,
            )

    session_id = run(work)
    emit({"session_id": session_id}, as_json, session_id)


@app.command()
def prompt(
    session: str,
    text: str,
    queue: bool = typer.Option(False, "--queue", help="Run after the current turn ends"),
    no_wake: bool = typer.Option(False, "--no-wake", help="Record only; run on the next wake"),
    input_id: str = typer.Option(None, "--id", help="Idempotency key (the message id)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Admit a prompt durably and wake the session."""

    async def work() -> Any:
        async with session_client() as client:
            delivery: Delivery = "queue" if queue else "steer"
            return await client.prompt(
                session, text, delivery=delivery, input_id=input_id, wake=not no_wake
            )

    receipt = run(work)
    emit(
        {
            "input_id": receipt.id,
            "admitted_seq": receipt.admitted_seq,
            "delivery": receipt.delivery,
        },
        as_json,
        f"{receipt.id} admitted at seq {receipt.admitted_seq}",
    )


@app.command()
def resume(session: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Run the session now (or join its busy period) and print the outcome."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.resume(session)

    outcome = run(work)
    emit(outcome.model_dump(mode="json"), as_json, outcome.type)
    if outcome.type != "succeeded":
        raise typer.Exit(SESSION_FAILED)


@app.command()
def interrupt(
    session: str,
    reason: str = typer.Option("user", "--reason"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Stop the running busy period; prints whether this request was the one accepted."""

    async def work() -> Interruption:
        async with session_client() as client:
            return await client.interrupt(session, reason)

    answer = run(work)
    text = {
        "stopped": "interrupted",
        "idle": "nothing to interrupt",
        "sent": "sent, not confirmed: no worker answered; it takes effect when one polls",
    }[answer.status]
    emit({"accepted": bool(answer), "status": answer.status}, as_json, text)


@app.command()
def status(session: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Busy or idle, phase, step, running tools, pending inputs."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.status(session)

    state = run(work)
    drain = state.drain.model_dump(mode="json") if state.drain else None
    value = {"session_id": session, "busy": state.busy, "pending_inputs": state.pending_inputs}
    value["drain"] = drain
    phase = drain["phase"] if drain else "idle"
    tools = ", ".join(t["name"] for t in drain["running_tools"]) if drain else ""
    text = f"{'busy' if state.busy else 'idle'} · {phase} · {state.pending_inputs} pending"
    emit(value, as_json, text + (f" · running {tools}" if tools else ""))


@app.command()
def sessions(
    directory: str = typer.Option(None, "--directory"),
    search: str = typer.Option(None, "--search"),
    roots: bool = typer.Option(False, "--roots", help="Only top-level sessions"),
    limit: int = typer.Option(100, "--limit"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Sessions, most recently updated first."""

    async def work() -> list[Any]:
        async with session_client() as client:
            return await client.list_sessions(
                directory=directory, search=search, roots_only=roots, limit=limit
            )

    found = run(work)
    if as_json:
        print(json.dumps([_session_json(s) for s in found], ensure_ascii=False))
        return
    for info in found:
        console.print(f"{info.id}  {info.title or '(untitled)'}  [dim]{info.directory}[/]")


def _session_json(info: Any) -> dict[str, Any]:
    value = asdict(info)
    value["model"] = str(info.model) if info.model else None
    value["tokens"] = info.tokens.model_dump()
    return value


@app.command()
def show(session: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """The session's transcript."""

    async def work() -> list[Any]:
        async with session_client() as client:
            return await client.messages(session)

    messages = run(work)
    if as_json:
        print(json.dumps([m.model_dump(mode="json") for m in messages], ensure_ascii=False))
        return
    for message in messages:
        _show(message)


def _show(message: Any) -> None:
    if message.type == "user":
        console.print(f"[bold cyan]you[/] {message.text}", highlight=False)
    elif message.type == "assistant":
        console.print(f"[bold magenta]assistant[/] [dim]{message.model}[/]", highlight=False)
        for part in message.content:
            if part.type == "text":
                console.print(part.text, highlight=False, markup=False)
            elif part.type == "reasoning":
                console.print(part.text, style="dim italic", highlight=False, markup=False)
            else:
                console.print(f"[yellow]tool {part.name}[/] [dim]{part.state.status}[/]")
        if message.error:
            console.print(f"[red]{message.error.type}: {message.error.message}[/]")
    else:
        console.print(f"[dim]{message.type}[/] {getattr(message, 'text', '')}", highlight=False)


@app.command()
def watch(
    session: str,
    after: int = typer.Option(-1, "--after", help="Only events after this seq"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per stored event"),
    until_idle: bool = typer.Option(False, "--until-idle", help="Stop when the session is idle"),
) -> None:
    """Follow the session's events live: history first, then new events as they commit."""

    async def work() -> None:
        async with session_client() as client:
            await client.session(session)
            await follow(client, session, after=after, as_json=as_json, until_idle=until_idle)

    run(work)


async def follow(
    client: SessionClient, session_id: str, *, after: int, as_json: bool, until_idle: bool
) -> None:
    renderer = Renderer(console, as_json=as_json)
    try:
        async for event in client.events(session_id, after=after, follow=True):
            renderer.render(event)
            idle = until_idle and event.type in TERMINALS
            if idle and not (await client.status(session_id)).busy:
                return
    finally:
        renderer.close()


# --- the stack ----------------------------------------------------------------------------------


@app.command()
def worker() -> None:
    """Run a worker (settings from the environment)."""
    from worker import main as worker_main

    run(worker_main)


@app.command()
def dev(
    ui_port: int = typer.Option(8233, "--ui-port"),
) -> None:
    """Start the embedded stack: Temporal dev server (UI), a worker and the SQLite store.

    Ctrl-C stops the worker and, if this command started it, the dev server.
    """
    from sessionflow.devstack import StackError, ensure_server, stop_server

    async def work() -> None:
        from store import open_store
        from worker import (
            build_worker,
            ensure_sweep_schedule,
            reap_orphans_forever,
            tools_from_env,
        )

        # Ctrl-C from here on stops everything in order, whenever it comes.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            server, client = await ensure_server(Options.address, ui_port=ui_port)
        except StackError as error:
            raise fail(str(error), UNREACHABLE) from None
        settings = Settings.from_env()
        store = await open_store(Options.database_url or settings.database_url, settings=settings)
        reaper = asyncio.create_task(reap_orphans_forever())
        try:
            await ensure_sweep_schedule(client, task_queue=Options.task_queue)
            async with build_worker(
                client,
                store,
                task_queue=Options.task_queue,
                tools=tools_from_env(settings),
                sandboxed=settings.workflow_sandbox,
            ):
                console.print(f"Temporal UI: {server.ui}", soft_wrap=True, highlight=False)
                console.print(f"store: {store.db.url}", soft_wrap=True, highlight=False)
                console.print("worker running; Ctrl-C to stop")
                await stop.wait()
                console.print("stopping the worker and the dev server…")
        finally:
            reaper.cancel()
            await store.close()
            if server.pid is not None:
                stop_server()

    run(work)


@app.command()
def demo(
    ui_port: int = typer.Option(8233, "--ui-port"),
    state_dir: Path = typer.Option(Path(".sessionflow"), "--state-dir"),
) -> None:
    """One command: a live session on the embedded default, with five tools in parallel."""
    from sessionflow.demo import run_demo

    state = state_dir.resolve()
    run(lambda: run_demo(console, Options.address, ui_port=ui_port, state_dir=state))


cli_answers.register(app, sys.modules[__name__])  # approve, deny, answer, agent

if __name__ == "__main__":
    sys.exit(app())
