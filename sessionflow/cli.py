"""The ``sessionflow`` command line (typer).

Exit codes: 0 success; 1 a user error (unknown session, bad model reference, missing
workspace, bad input, no store where one was expected); 2 no Temporal server, database or
worker reachable; 3 the session's last busy period failed or was interrupted (``resume``,
``watch --until-idle``).

Everything heavy (Temporal, SQLAlchemy, the worker) is imported inside the commands, so
``--help`` and a mistyped flag answer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

from sessionflow import cli_answers, locate
from sessionflow.errors import SessionflowError
from sessionflow.models.journal import RevertPlan
from sessionflow.models.spend import Spend

if TYPE_CHECKING:
    from rich.console import Console

    from sessionflow.client import Interruption, SessionClient
    from sessionflow.models.permissions import PermissionRequest

DEFAULT_ADDRESS = "127.0.0.1:7233"
USER_ERROR, UNREACHABLE, SESSION_FAILED, PROMPTS_UNRUN = 1, 2, 3, 4
TERMINAL_FAILURES = ("session.execution.failed", "session.execution.interrupted")
T = TypeVar("T")


def _epilog() -> str:
    address = os.environ.get("SESSIONFLOW_TEMPORAL_ADDRESS", DEFAULT_ADDRESS)
    queue = os.environ.get("SESSIONFLOW_TASK_QUEUE", "sessionflow")
    store = locate.database_url(address=address, task_queue=queue)
    return (
        f"Store here: {store} (--database, else SESSIONFLOW_DATABASE_URL, else the nearest "
        f".sessionflow/ upward, else the store of a stack running here on {queue}). "
        f"Temporal: {address}."
    )


app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="Durable agent sessions.",
    epilog=_epilog(),
)


class Options:
    """The global options, as every command sees them."""

    address: str = DEFAULT_ADDRESS
    database: str | None = None
    task_queue: str | None = None

    @classmethod
    def database_url(cls) -> str:
        return locate.database_url(cls.database, address=cls.address, task_queue=cls.queue())

    @classmethod
    def queue(cls) -> str:
        from sessionflow.models.drain import TASK_QUEUE

        return cls.task_queue or TASK_QUEUE

    @classmethod
    def where(cls) -> str:
        return f"store {cls.database_url()}, Temporal {cls.address}, task queue {cls.queue()}"


@app.callback()
def main(
    temporal: str = typer.Option(
        DEFAULT_ADDRESS,
        "--temporal",
        envvar="SESSIONFLOW_TEMPORAL_ADDRESS",
        help="Temporal address HOST:PORT",
    ),
    database: str = typer.Option(
        None,
        "--database",
        envvar="SESSIONFLOW_DATABASE_URL",
        help="Store URL (default: .sessionflow/sessionflow.db in the nearest .sessionflow/ "
        "upward from here, else here)",
    ),
    task_queue: str = typer.Option(
        None,
        "--task-queue",
        envvar="SESSIONFLOW_TASK_QUEUE",
        help="Task queue of the workers (default: sessionflow)",
    ),
) -> None:
    Options.address, Options.database, Options.task_queue = temporal, database, task_queue


def console() -> Console:
    from rich.console import Console

    return Console()


def fail(message: str, code: int = USER_ERROR) -> typer.Exit:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def note(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(
        f"[yellow]note:[/] {escape(message)}", highlight=False, soft_wrap=True
    )


def run(
    work: Callable[[], Coroutine[Any, Any, T]],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(work())
    except typer.Exit:
        raise
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:
        # A reader that went away (``| head``) is not an error: stop writing, quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise typer.Exit(0) from None
    except Exception as error:
        raise _failure(error) from None


def _failure(error: Exception) -> typer.Exit:
    """One line for every error a user can meet; a traceback only for a defect."""
    from sessionflow.devstack import StackError
    from sessionflow.errors import (
        NotFoundError,
        NoWorkerError,
        StoreUnavailableError,
    )

    if isinstance(error, NoWorkerError | StoreUnavailableError | StackError):
        return fail(str(error), UNREACHABLE)
    if isinstance(error, NotFoundError):
        return fail(f"{error} ({Options.where()})")
    if isinstance(error, SessionflowError | ValueError):
        return fail(str(error))
    if _unreachable(error):
        return fail(
            f"cannot reach the store or Temporal ({Options.where()}): {_first_line(error)}. "
            f"Start the embedded stack with `sessionflow dev`, or pass --temporal / --database.",
            UNREACHABLE,
        )
    raise error


def _unreachable(error: Exception) -> bool:
    import sqlalchemy.exc

    return isinstance(error, ConnectionError | OSError | RuntimeError | sqlalchemy.exc.DBAPIError)


def _first_line(error: Exception) -> str:
    cause = getattr(error, "orig", None) or error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


@asynccontextmanager
async def session_client(*, create: bool = False) -> AsyncIterator[SessionClient]:
    """A client on the global options' store and Temporal. Only commands that write
    (``create``) may bring a store into being; the others need one that exists."""
    from sessionflow.client import SessionClient
    from sessionflow.devstack import connect

    url = Options.database_url()
    path = locate.sqlite_path(url)
    if not create and path is not None and not path.is_file():
        raise fail(
            f"no store at {path}: create a session first (`sessionflow new`), run from the "
            f"directory that holds its .sessionflow/, or pass --database",
        )
    from sessionflow import telemetry
    from sessionflow.settings import Settings

    telemetry.configure(Settings.from_env().otel_exporter)
    temporal = await connect(Options.address, seconds=5)
    if temporal is None:
        raise fail(
            f"no Temporal server at {Options.address}. "
            f"Start one with `sessionflow dev`, or pass --temporal HOST:PORT.",
            UNREACHABLE,
        )
    client = await SessionClient.connect(
        client=temporal, database_url=url, task_queue=Options.queue()
    )
    try:
        yield client
    finally:
        await client.close()


def emit(value: Any, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(value, ensure_ascii=False, default=str), flush=True)
    else:
        console().print(text, highlight=False, soft_wrap=True)


JSON = typer.Option(False, "--json", help="Print JSON instead of text")


# --- sessions -----------------------------------------------------------------------------------


@app.command()
def new(
    workspace: Path = typer.Option(..., "--workspace", help="Directory the tools work in"),
    model: str = typer.Option(
        ..., "--model", help="<provider>/<model>, e.g. scripted/path/to/script.json"
    ),
    title: str = typer.Option("", "--title", help="A title to find the session by"),
    max_active_tools: int = typer.Option(
        8, "--max-active-tools", help="Tools one session runs at once"
    ),
    max_steps: int = typer.Option(
        None,
        "--max-steps",
        help="Model turns per prompt (a steer joins the prompt it steers); the last one may not "
        "call tools",
    ),
    auto_compact: bool = typer.Option(
        True,
        "--auto-compact/--no-auto-compact",
        help="Summarize older history before a request that would not fit the model",
    ),
    compaction_buffer: int = typer.Option(
        20_000, "--compaction-buffer", min=0, help="Tokens of the window kept free"
    ),
    keep_tokens: int = typer.Option(
        None,
        "--keep-tokens",
        min=0,
        help="Recent history kept verbatim by a compaction (default: a quarter of the window)",
    ),
    compaction_model: str = typer.Option(
        None, "--compaction-model", help="<provider>/<model> for summaries (default: --model)"
    ),
    agent: str = typer.Option(None, "--agent", help="The session's agent (default: build)"),
    system: str = typer.Option(None, "--system", help="Extra system prompt for every turn"),
    allow: list[str] = typer.Option(
        [], "--allow", help="TOOL[:PATTERN] calls run without asking, e.g. 'bash:pytest *'"
    ),
    ask: list[str] = typer.Option([], "--ask", help="TOOL[:PATTERN] calls wait for approval"),
    deny: list[str] = typer.Option([], "--deny", help="TOOL[:PATTERN] calls are refused"),
    network: bool = typer.Option(
        False, "--network/--no-network", help="Let bash commands reach the network"
    ),
    approval_timeout: float = typer.Option(
        None, "--approval-timeout", min=1, help="Seconds a call waits for approval, then is denied"
    ),
    key_on_workers: bool = typer.Option(
        False,
        "--key-on-workers",
        help="The model's API key is set on the workers only: do not look for it here",
    ),
    host: str = typer.Option(
        None,
        "--host",
        help="The host whose workers run its tools, where the workspace is "
        "(default: SESSIONFLOW_HOST, else local)",
    ),
    budget_usd: float = typer.Option(
        None, "--budget-usd", help="Pause at the first step once it spent this many USD"
    ),
    budget_tokens: int = typer.Option(
        None, "--budget-tokens", help="Pause at the first step once it used this many tokens"
    ),
    as_json: bool = JSON,
) -> None:
    """Create a session and print its id (the workspace, the model and its API key are checked
    first). Rules are the session's own, after its agent's; the last match wins."""
    if not key_on_workers:
        _require_api_key(model)
    permissions = _rules({"allow": allow, "ask": ask, "deny": deny})
    compaction = {
        "auto": auto_compact,
        "buffer": compaction_buffer,
        "keep_tokens": keep_tokens,
        "model": compaction_model,
    }

    async def work() -> str:
        async with session_client(create=True) as client:
            return await client.create_session(
                workspace=str(workspace),
                model=model,
                title=title,
                max_active_tools=max_active_tools,
                max_steps=max_steps,
                compaction=compaction,
                agent=agent,
                system=system,
                permissions=permissions,
                network=network,
                approval_timeout=approval_timeout,
                host=host,
                budget=_limits(budget_usd, budget_tokens),
            )

    session_id = run(work)
    emit({"session_id": session_id}, as_json, session_id)


def _require_api_key(model: str) -> None:
    """Refuse a real model whose API key is not set here (where ``dev`` runs its worker)."""
    from activities.providers.settings import ProviderSettings, missing_key

    provider = model.partition("/")[0]
    try:
        variable = missing_key(provider, ProviderSettings.from_env())
    except ValueError as error:
        raise fail(str(error)) from None
    if variable is not None:
        raise fail(
            f"{model} needs an API key and none is set: set {variable} in the environment of "
            "the worker (and here), or pass --key-on-workers when only the workers have it"
        )


def _rules(by_action: dict[str, list[str]]) -> list[dict[str, str]]:
    """``TOOL[:PATTERN]`` options as permission rules, allows first, then asks, then denies
    (the last match wins, so a deny always holds)."""
    rules = []
    for action, specs in by_action.items():
        for spec in specs:
            tool, _, pattern = spec.partition(":")
            if not tool.strip():
                raise fail(f"--{action} {spec!r}: give TOOL[:PATTERN], e.g. 'bash:git *'")
            rules.append({"tool": tool.strip(), "pattern": pattern or "*", "action": action})
    return rules


@app.command("check-script")
def check_script(
    path: Path = typer.Argument(..., help="A scripted model's JSON file"),
    as_json: bool = JSON,
) -> None:
    """Check a scripted model's file as `new` and a worker would; say what is wrong, where."""
    from sessionflow.validate import check_script as check

    try:
        turns = check(path.resolve())
    except ValueError as error:
        raise fail(str(error)) from None
    emit({"path": str(path.resolve()), "turns": turns}, as_json, f"{path}: {turns} turn(s), ok")


@app.command()
def prompt(
    session: str = typer.Argument(..., help="Session id"),
    text: str = typer.Argument(None, help="The prompt (or use --file, or pipe it on stdin)"),
    file: Path = typer.Option(
        None, "--file", help="Read the prompt from this file ('-' for stdin)", allow_dash=True
    ),
    queue: bool = typer.Option(False, "--queue", help="Run after the current turn ends"),
    no_wake: bool = typer.Option(False, "--no-wake", help="Record only; run on the next wake"),
    input_id: str = typer.Option(None, "--id", help="Idempotency key (the message id)"),
    as_json: bool = JSON,
) -> None:
    """Admit a prompt durably and wake the session."""
    body = _prompt_text(text, file)

    async def work() -> Any:
        async with session_client() as client:
            receipt = await client.prompt(
                session,
                body,
                delivery="queue" if queue else "steer",
                input_id=input_id,
                wake=not no_wake,
            )
            return receipt, None if no_wake else await client.waiting_for_worker(session)

    receipt, waiting = run(work)
    value = {"input_id": receipt.id, "admitted_seq": receipt.admitted_seq}
    value |= {"delivery": receipt.delivery, "waiting_for_worker": waiting}
    if waiting:
        note(f"admitted; it runs when a worker polls: {waiting}")
    emit(value, as_json, f"{receipt.id} admitted at seq {receipt.admitted_seq}")


def _prompt_text(text: str | None, file: Path | None) -> str:
    if text is not None and file is not None:
        raise fail("give the prompt as an argument or with --file, not both")
    if text is not None:
        return text
    if file is None and sys.stdin.isatty():
        raise fail("no prompt: pass it as an argument, with --file PATH, or on stdin")
    try:
        raw = sys.stdin.buffer.read() if file is None or str(file) == "-" else file.read_bytes()
        return raw.decode("utf-8")
    except OSError as error:
        raise fail(f"cannot read the prompt from {file}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise fail(f"the prompt is not UTF-8 (byte {error.start}): convert it first") from None


@app.command()
def resume(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """Run the session now (or join its busy period) and print the outcome.

    With nothing pending this asks the model once more on the existing history (one turn)."""

    async def work() -> Any:
        async with session_client() as client:
            state = await client.status(session)
            if not state.busy and not state.pending_inputs:
                note("nothing is pending: resume asks the model once more on the history")
            return await client.resume(session)

    outcome = run(work)
    error = f": {outcome.error.message}" if outcome.error else ""
    reason = f" ({outcome.reason})" if outcome.reason and not error else ""
    emit(outcome.model_dump(mode="json"), as_json, f"{outcome.type}{reason}{error}")
    if outcome.type != "succeeded":
        raise typer.Exit(SESSION_FAILED)


@app.command()
def compact(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """Compact the session's history at its next step boundary; prints the compaction's id."""

    async def work() -> str:
        async with session_client() as client:
            return await client.compact(session)

    input_id = run(work)
    emit({"input_id": input_id}, as_json, input_id)


@app.command()
def interrupt(
    session: str = typer.Argument(..., help="Session id"),
    reason: str = typer.Option("user", "--reason", help="Recorded with the interruption"),
    as_json: bool = JSON,
) -> None:
    """Stop the running busy period; says whether it stopped, found nothing, or is queued."""

    async def work() -> Interruption:
        async with session_client() as client:
            return await client.interrupt(session, reason)

    answer = run(work)
    text = {
        "stopped": "interrupted",
        "idle": "nothing to interrupt",
        "sent": answer.detail or "queued until a worker is back",
    }[answer.status]
    value = {"accepted": bool(answer), "status": answer.status, "detail": answer.detail}
    emit(value, as_json, text)


@app.command()
def status(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """Busy or idle, phase, step, running tools, pending inputs; and a missing worker."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.status(session)

    state = run(work)
    emit(_status_json(state), as_json, _status_text(state))


def _status_json(state: Any) -> dict[str, Any]:
    value = {"session_id": state.session_id, "busy": state.busy}
    value |= {"pending_inputs": state.pending_inputs}
    value |= {"drain": state.drain.model_dump(mode="json") if state.drain else None}
    value |= {"waiting_for_worker": state.waiting_for_worker}
    value |= {"spend": state.spend.model_dump(mode="json")}
    value |= {"budget": state.budget.model_dump(mode="json") if state.budget else None}
    reached = state.budget_reached
    value |= {"budget_reached": reached.model_dump(mode="json") if reached else None}
    return value | {"subagents": [_status_json(child) for child in state.subagents]}


def _status_text(state: Any, indent: str = "") -> str:
    """One line for the session, its asks, then each subagent it waits on, indented."""
    drain = state.drain
    phase = drain.phase if drain else ("waiting" if state.waiting_for_worker else "idle")
    tools = ", ".join(t.name for t in drain.running_tools) if drain else ""
    text = f"{indent}{'busy' if state.busy else 'idle'} · {phase} · {state.pending_inputs} pending"
    text += f" · running {tools}" if tools else ""
    text += f" · {state.waiting_for_worker}" if state.waiting_for_worker else ""
    text += f" · {state.spend.describe()}"
    if state.budget is not None:
        reached = state.budget_reached
        text += f" · {reached.describe()}" if reached else f" · budget {state.budget.describe()}"
    for host in drain.waiting_hosts if drain else ():
        text += f" · waiting for host {host}"
    if drain and drain.waiting_capacity:
        text += f" · {drain.waiting_capacity}"
    for request in drain.waiting if drain else ():
        what = request.question or request.summary
        command = "answer" if request.kind == "question" else "approve"
        text += f"\n{indent}waits for an answer: {request.request_id} ({request.tool}: {what})"
        text += f" — `sessionflow {command} {state.session_id} …`"
    for child in state.subagents:
        text += f"\n{indent}  subagent {child.session_id}:\n" + _status_text(child, indent + "  ")
    return text


def spend_line(spend: Spend) -> str:
    """``in 120 · out 40 · cache read 0 · $0.0012`` (or the cost's unknown part)."""
    t = spend.tokens
    return f"in {t.input} · out {t.output} · cache read {t.cache.read} · {spend.describe()}"


@app.command()
def children(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """The child sessions its ``task`` calls started (subagents), oldest first."""
    from sessionflow.show import session_json

    async def work() -> list[Any]:
        async with session_client() as client:
            return await client.children(session)

    found = run(work)
    if as_json:
        print(json.dumps([session_json(s) for s in found], ensure_ascii=False), flush=True)
        return
    out = console()
    if not found:
        out.print(f"{session} started no subagents", style="dim", highlight=False)
    for info in found:
        mode = "background" if (info.settings.get("task") or {}).get("background") else "task"
        out.print(f"{info.id}  @{info.agent}  {info.title or ''}  [dim]{mode}[/]", highlight=False)


@app.command()
def usage(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """Tokens and cost: the session's own, each subagent's below it, and the tree's total."""
    from pydantic import TypeAdapter

    from sessionflow.client import Usage

    async def work() -> Any:
        async with session_client() as client:
            return await client.usage(session)

    spent = run(work)
    if as_json:
        value = TypeAdapter(Usage).dump_python(spent, mode="json")
        print(json.dumps(value, ensure_ascii=False), flush=True)
        return

    def lines(node: Any, indent: str) -> list[str]:
        line = f"{indent}{node.session_id}  @{node.agent or 'default'}  {spend_line(node.own)}"
        return [line, *(x for child in node.children for x in lines(child, indent + "  "))]

    out = console()
    for line in lines(spent, ""):
        out.print(line, highlight=False)
    out.print(f"total  {spend_line(spent.total)}", highlight=False)


@app.command()
def jobs(session: str = typer.Argument(..., help="Session id"), as_json: bool = JSON) -> None:
    """Its background tasks: each child session, running or how its last busy period ended.
    Interrupting the session cancels those still running."""
    from sessionflow.show import session_json

    async def work() -> list[Any]:
        async with session_client() as client:
            return await client.jobs(session)

    found = run(work)
    if as_json:
        value = [
            {"session": session_json(j.session), "running": j.running, "outcome": j.outcome}
            for j in found
        ]
        print(json.dumps(value, ensure_ascii=False), flush=True)
        return
    out = console()
    if not found:
        out.print(f"{session} has no background tasks", style="dim", highlight=False)
    for job in found:
        state = "running" if job.running else (job.outcome or "not started")
        out.print(f"{job.session.id}  @{job.session.agent}  {state}  {job.session.title or ''}")


def _limits(usd: float | None, tokens: int | None) -> dict[str, float]:
    return {k: v for k, v in (("usd", usd), ("tokens", tokens)) if v is not None}


@app.command()
def budget(
    session: str = typer.Argument(..., help="Session id"),
    usd: float = typer.Option(None, "--usd", help="Its USD limit from now (priced steps)"),
    tokens: int = typer.Option(None, "--tokens", help="Its token limit from now"),
    clear: bool = typer.Option(False, "--clear", help="Remove every limit"),
    as_json: bool = JSON,
) -> None:
    """Show or change a session's budget. A session its budget stopped continues with
    `sessionflow resume` once the new limits are above what it spent."""
    changes = _limits(usd, tokens)
    if clear and changes:
        raise typer.BadParameter("give --clear alone, or the limits to set")

    async def work() -> Any:
        async with session_client() as client:
            info = await client.session(session)
            if not (clear or changes):
                return info
            kept = info.budget.model_dump(exclude_none=True) if info.budget else {}
            return await client.set_budget(session, None if clear else {**kept, **changes})

    info = run(work)
    reached = info.budget.reached(info.spend) if info.budget is not None else None
    value = {
        "session_id": info.id,
        "budget": info.budget.model_dump(mode="json") if info.budget else None,
        "spend": info.spend.model_dump(mode="json"),
        "budget_reached": reached.model_dump(mode="json") if reached else None,
    }
    text = f"{info.id}: budget {info.budget.describe() if info.budget else 'none'}"
    text += f" · spent {spend_line(info.spend)}"
    if reached is not None:
        text += f"\n{reached.describe()}: raise it to continue (`sessionflow resume {info.id}`)"
    emit(value, as_json, text)


@app.command()
def move(
    session: str = typer.Argument(..., help="Session id"),
    host: str = typer.Option(..., "--host", help="The host its tools run on from now"),
    workspace: Path = typer.Option(
        None, "--workspace", help="Its workspace on that host (default: the same path)"
    ),
    as_json: bool = JSON,
) -> None:
    """Move a session to another host between busy periods; that host checks the workspace."""

    async def work() -> Any:
        async with session_client() as client:
            where = str(workspace) if workspace is not None else None
            return await client.move(session, host, workspace=where)

    moved = run(work)
    value = {"session_id": moved.id, "host": moved.host, "directory": moved.directory}
    emit(value, as_json, f"{moved.id} now runs its tools on {moved.host} in {moved.directory}")


@app.command()
def revert(
    session: str = typer.Argument(..., help="Session id"),
    message: str = typer.Argument(..., help="The last message to keep"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would change; change nothing"),
    force: list[str] = typer.Option(
        [], "--force", help="A path to restore (or leave) although it changed since; repeatable"
    ),
    as_json: bool = JSON,
) -> None:
    """Put the workspace and the conversation back to MESSAGE, between busy periods."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.revert(session, message, dry_run=dry_run, force=force)

    _rewound(run(work), as_json)


@app.command()
def unrevert(
    session: str = typer.Argument(..., help="Session id"),
    force: list[str] = typer.Option(
        [], "--force", help="A path to put back although it changed since; repeatable"
    ),
    as_json: bool = JSON,
) -> None:
    """Undo the session's last revert, while no prompt came after it."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.unrevert(session, force=force)

    _rewound(run(work), as_json)


@app.command()
def fork(
    session: str = typer.Argument(..., help="Session id"),
    message: str = typer.Argument(..., help="The last message the fork keeps"),
    workspace: str = typer.Argument(..., help="A new directory for the fork's workspace"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be copied; do nothing"),
    force: list[str] = typer.Option(
        [], "--force", help="A path to copy as it is now when its content then is unknown"
    ),
    as_json: bool = JSON,
) -> None:
    """A new session with the history up to MESSAGE and a copy of the workspace as it was
    then, in WORKSPACE; the session itself is not changed."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.fork(
                session, message, workspace=workspace, dry_run=dry_run, force=force
            )

    _rewound(run(work), as_json)


def _rewound(plan: RevertPlan, as_json: bool) -> None:
    """A revert's plan, path by path; exits 1 when it was refused."""
    from rich.markup import escape

    code = USER_ERROR if plan.refused is not None or plan.refusals else 0
    if as_json:
        print(plan.model_dump_json(), flush=True)
        if code:
            raise typer.Exit(code)
        return
    out = console()
    verb = {"restore": "restore", "delete": "delete", "unchanged": "keep"}
    for path in plan.paths:
        name = escape(path.path)
        if path.refused is not None:
            line = f"[red]refused[/] {name}: {escape(path.reason or '')}  (--force {name})"
        else:
            lines = f"  (+{path.added} -{path.removed})" if path.added is not None else ""
            note = f"  ({escape(path.reason)})" if path.reason else ""
            line = f"{verb[path.action]:8s} {name}{lines}{note}"
        out.print(line, highlight=False, soft_wrap=True)
    if plan.refused is not None:
        out.print(f"[red]refused:[/] {escape(plan.refused)}", highlight=False, soft_wrap=True)
    elif plan.refusals:
        out.print("[red]refused: nothing was changed[/]", highlight=False)
    elif plan.applied and plan.kind == "fork":
        for skipped in plan.left_out:
            out.print(f"left out {escape(skipped)} (protected or not a file)", highlight=False)
        done = f"forked {plan.session_id} at {plan.message_id}: {plan.fork_session_id}"
        out.print(f"{done} in {escape(plan.directory or '')}", highlight=False, soft_wrap=True)
    elif plan.applied:
        done = f"{plan.kind} of {plan.session_id} to {plan.message_id}: done"
        out.print(done, highlight=False)
    else:
        out.print("dry run: nothing was changed", highlight=False)
    if code:
        raise typer.Exit(code)


@app.command()
def hosts(as_json: bool = JSON) -> None:
    """The hosts whose workers run tools: each worker's lease, state and tools offered."""

    async def work() -> Any:
        async with session_client() as client:
            return await client.hosts()

    found = run(work)
    if as_json:
        rows = [dataclasses.asdict(w) for w in found]
        print(json.dumps(rows, ensure_ascii=False), flush=True)
        return
    out = console()
    if not found:
        out.print("no host has registered: no worker runs tools", style="dim", highlight=False)
    style = {"live": "green", "late": "yellow", "gone": "red"}
    for w in found:
        seen = f"seen {w.seen_ms_ago / 1000:.1f}s ago"
        tools = f"{len(w.tools)} tools"
        line = f"{w.host}  [{style[w.status]}]{w.status}[/]  {w.worker}  {seen}  {tools}"
        out.print(f"{line}  [dim]{w.version}[/]", highlight=False)


@app.command()
def tools(
    session: str = typer.Argument(None, help="Session id: what its agent can call"),
    as_json: bool = JSON,
) -> None:
    """The tools a worker configured like this shell offers (SESSIONFLOW_TOOLS, entry points,
    SESSIONFLOW_MCP): name, origin, retry-safe, default permission; for a session, what its
    agent can call."""
    from sessionflow.agents import load_agents
    from sessionflow.catalogue import session_tools
    from sessionflow.settings import Settings

    async def work() -> Any:
        if session is None:  # the configuration alone: no store needed
            return await session_tools(None, load_agents(Settings.from_env().agents_file))
        async with session_client() as client:
            return await session_tools(await client.session(session), client.agents)

    found, unavailable = run(work)
    if as_json:
        value = {
            "tools": [t.model_dump() for t in found],
            "unavailable": [u.model_dump() for u in unavailable],
        }
        print(json.dumps(value, ensure_ascii=False), flush=True)
        return
    out = console()
    for tool in found:
        safe = "retry-safe" if tool.retry_safe else "not retry-safe"
        out.print(
            f"{tool.name}  [dim]{tool.origin} · {safe} · {tool.permission}[/]  {tool.description}",
            highlight=False,
        )
    for server in unavailable:
        out.print(f"MCP server {server.server} unavailable: {server.error}", style="yellow")


@app.command()
def sessions(
    directory: Path = typer.Option(None, "--directory", help="Only sessions in this workspace"),
    search: str = typer.Option(None, "--search", help="Only titles containing this text"),
    roots: bool = typer.Option(False, "--roots", help="Only top-level sessions"),
    limit: int = typer.Option(100, "--limit", help="At most this many"),
    as_json: bool = JSON,
) -> None:
    """Sessions, most recently updated first."""
    from sessionflow.show import session_json

    where = str(directory.expanduser().resolve()) if directory else None

    async def work() -> list[Any]:
        async with session_client() as client:
            return await client.list_sessions(
                directory=where,
                search=search,
                roots_only=roots,
                limit=limit,
            )

    found = run(work)
    if as_json:
        print(json.dumps([session_json(s) for s in found], ensure_ascii=False), flush=True)
        return
    out = console()
    if not found:
        out.print(f"no sessions in {Options.database_url()}", style="dim", highlight=False)
    for info in found:
        out.print(f"{info.id}  {info.title or '(untitled)'}  [dim]{info.directory}[/]")


@app.command()
def show(
    session: str = typer.Argument(..., help="Session id"),
    full: bool = typer.Option(False, "--full", help="Whole prompts and tool output, uncut"),
    as_json: bool = JSON,
) -> None:
    """The session's transcript: prompts, answers, tool calls and their results."""
    from sessionflow.show import Transcript

    async def work() -> tuple[Any, list[Any]]:
        async with session_client() as client:
            return await client.session(session), await client.messages(session)

    info, messages = run(work)
    if as_json:
        print(json.dumps([m.model_dump(mode="json") for m in messages], ensure_ascii=False))
        return
    out = console()
    transcript = Transcript(out, full=full)
    for message in messages:
        transcript.show(message)
    line = f"spent  {spend_line(info.spend)}"
    if info.budget is not None:
        reached = info.budget.reached(info.spend)
        line += f" · {reached.describe()}" if reached else f" · budget {info.budget.describe()}"
    out.print(f"[dim]{line}[/]", highlight=False)


@app.command()
def watch(
    session: str = typer.Argument(..., help="Session id"),
    after: int = typer.Option(-1, "--after", help="Only events after this seq"),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per stored event"),
    until_idle: bool = typer.Option(
        False, "--until-idle", help="Replay everything, then stop once the session is idle"
    ),
    full: bool = typer.Option(False, "--full", help="All of each tool's output"),
) -> None:
    """Follow the session's events live: history first, then new events as they commit. On a
    terminal, a call that waits for approval (or a question) is offered for an answer.

    With --until-idle the exit code is 3 when the last busy period failed or was interrupted,
    4 when the session is idle with prompts that no busy period will run."""
    from sessionflow.follow import Followed, follow

    # The store's own lines (a listener reconnecting, a read retried) would land in the
    # streamed text: the follower says "store unavailable, retrying" once instead.
    logging.getLogger("store").addHandler(logging.NullHandler())

    interactive = not as_json and sys.stdin.isatty() and sys.stdout.isatty()

    async def work() -> Followed:
        async with session_client() as client:
            await client.session(session)

            async def ask(request: PermissionRequest) -> None:
                await cli_answers.ask_person(client, session, request, note)

            return await follow(
                client,
                session,
                console(),
                after=after,
                as_json=as_json,
                until_idle=until_idle,
                full=full,
                on_waiting=note,
                on_ask=ask if interactive else None,
            )

    followed = run(work)
    if followed.unrun:
        prompts = "prompt is" if followed.unrun == 1 else "prompts are"
        note(
            f"{followed.unrun} {prompts} pending that no busy period will run (an interrupt "
            f"claimed their wake, or they were admitted without one): `sessionflow resume "
            f"{session}` runs them"
        )
        raise typer.Exit(PROMPTS_UNRUN)
    if until_idle and followed.last in TERMINAL_FAILURES:
        raise typer.Exit(SESSION_FAILED)


# --- the stack ----------------------------------------------------------------------------------


@app.command()
def worker(
    host: str = typer.Option(
        None,
        "--host",
        help="The host whose sessions' tools it runs, on <queue>@<host> (default: "
        "SESSIONFLOW_HOST, else local: on the shared queue)",
    ),
    serve: str = typer.Option(
        None,
        "--serve",
        help="all (default), turns (model turns only, no tools) or tools (only its host's tools)",
    ),
) -> None:
    """Run a worker on the global options' store, Temporal and task queue."""
    # worker.main reads its settings from the environment: hand it the options the same way.
    if host is not None:
        os.environ["SESSIONFLOW_HOST"] = host
    if serve is not None:
        os.environ["SESSIONFLOW_SERVE"] = serve
    os.environ["SESSIONFLOW_DATABASE_URL"] = Options.database_url()
    os.environ["SESSIONFLOW_TEMPORAL_ADDRESS"] = Options.address
    os.environ["SESSIONFLOW_TASK_QUEUE"] = Options.queue()
    from worker import main as worker_main

    run(worker_main)


@app.command()
def serve(
    host: str = typer.Option(None, "--host", help="Default 127.0.0.1 (off it, a token is needed)"),
    port: int = typer.Option(None, "--port", help="Default 8765"),
) -> None:
    """Serve the HTTP API and the live session page (settings: SESSIONFLOW_API_*)."""
    from sessionflow.api.serve import ApiSettings, event_loop, serve
    from sessionflow.settings import SettingsError

    try:
        api = ApiSettings.from_env(host=host, port=port)
    except SettingsError as error:
        raise fail(str(error)) from None
    run(
        lambda: serve(Options.address, Options.database_url(), Options.queue(), api),
        loop_factory=event_loop(),
    )


PORT = typer.Option(
    None, "--port", help="Dev server port when one is started (default: the --temporal port)"
)
UI_PORT = typer.Option(None, "--ui-port", help="Temporal UI port (default: a free one, 8233 first)")


@app.command()
def dev(port: int = PORT, ui_port: int = UI_PORT) -> None:
    """Start the embedded stack: Temporal dev server (UI), a worker and the SQLite store.

    Ctrl-C stops the worker and, if this command started it, the dev server."""
    from sessionflow.devstack import run_dev

    run(lambda: run_dev(console(), _stack_options(port, ui_port)))


@app.command()
def demo(
    port: int = PORT,
    ui_port: int = UI_PORT,
    state_dir: Path = typer.Option(
        None, "--state-dir", help="Where the store and the dev server's state go"
    ),
) -> None:
    """One command: a live session on the embedded default, with five tools in parallel."""
    from sessionflow.demo import run_demo

    options = _stack_options(port, ui_port, state_dir)
    run(lambda: run_demo(console(), options))


def _stack_options(port: int | None, ui_port: int | None, state: Path | None = None) -> Any:
    from sessionflow.devstack import StackOptions

    state = state.resolve() if state else locate.state_dir()
    database = Options.database
    url = (
        locate.database_url(database)
        if database or os.environ.get("SESSIONFLOW_DATABASE_URL")
        else f"sqlite+aiosqlite:///{state / locate.DATABASE_FILE}"
    )
    host, _, default_port = Options.address.rpartition(":")
    return StackOptions(
        host=host or "127.0.0.1",
        port=port or int(default_port),
        ui_port=ui_port,
        state_dir=state,
        database_url=url,
        task_queue=Options.task_queue,
    )


cli_answers.register(app, sys.modules[__name__])  # approve, deny, answer, agent


def entry() -> None:
    """The ``sessionflow`` command: the CLI, then an exit that cannot hang.

    A Temporal connection still being attempted when the process ends (a connect given up on
    by its timeout, against a port that accepts but never answers) can deadlock the SDK's
    native runtime on interpreter shutdown: dropping the runtime waits for a thread that is
    trying to enter the finalizing interpreter (seen as a CLI that printed its error and never
    exited). Once the command is done, nothing but that is left to finalize: flush, shut
    tracing down, and leave with ``os._exit``.
    """
    # A mistyped command line is the user's error (1); 2 means unreachable. (Typer carries its
    # own click: its UsageError is found through the public BadParameter.)
    usage = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    usage.exit_code = USER_ERROR  # type: ignore[attr-defined]
    code = 0
    try:
        app(args=hoist_globals(sys.argv[1:]), prog_name="sessionflow")
    except SystemExit as done:
        if isinstance(done.code, str):
            print(done.code, file=sys.stderr)
        code = done.code if isinstance(done.code, int) else int(done.code is not None)
    except KeyboardInterrupt:
        code = 130
    leave(code)


GLOBAL_OPTIONS = ("--temporal", "--database", "--task-queue")


def hoist_globals(argv: list[str]) -> list[str]:
    """``argv`` with the global options first: they are honoured after the subcommand too
    (``sessionflow watch S --database URL``), where click takes them only before it."""
    found: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            rest += argv[index:]
            break
        name = arg.partition("=")[0]
        if name in GLOBAL_OPTIONS:
            width = 1 if "=" in arg else 2
            found += argv[index : index + width]
            index += width
            continue
        rest.append(arg)
        index += 1
    return found + rest


def leave(code: int) -> NoReturn:
    """End a process that used Temporal without finalizing it (see ``entry``)."""
    tracing = sys.modules.get("opentelemetry.trace")
    if tracing is not None:
        shutdown = getattr(tracing.get_tracer_provider(), "shutdown", None)
        if shutdown is not None:
            shutdown()  # export the last spans (os._exit skips the SDK's atexit hook)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (| head), or closed
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
