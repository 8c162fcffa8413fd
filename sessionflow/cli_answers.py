"""``sessionflow approve | deny | answer | agent``: answering what a session waits for, and
choosing its agent. ``register`` adds them to the main app (``sessionflow/cli.py``), which
passes itself: run as ``python -m sessionflow.cli`` it is ``__main__``, and its options live
there."""

from __future__ import annotations

import asyncio
import getpass
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sessionflow.client import SessionClient
    from sessionflow.models.permissions import (
        Decision,
        PermissionRequest,
        RequestKind,
        RespondResult,
    )

SESSION = typer.Argument(..., help="Session id")
REQUEST = typer.Argument(None, help="The waiting request's id (default: the only one waiting)")
JSON = typer.Option(False, "--json", help="Print JSON instead of text")


async def _pick(
    cli: ModuleType, client: SessionClient, session: str, request: str | None, kind: RequestKind
) -> str:
    """The named request, or the only one of ``kind`` waiting; several or none is a clear
    error, and so is a request of the other kind (``approve`` and ``deny`` answer permission
    asks, ``answer`` questions): it names what waits and the command that answers it."""
    from sessionflow.client import wrong_kind

    waiting = await client.waiting(session)
    if request is not None:
        named = next((r for r in waiting if r.request_id == request), None)
        if named is not None and named.kind != kind:
            raise wrong_kind(session, named)
        return request
    mine = [r for r in waiting if r.kind == kind]
    if len(mine) == 1:
        return mine[0].request_id
    if not mine and waiting:
        raise wrong_kind(session, waiting[0])
    if not mine:
        raise cli.fail(f"nothing in session {session} waits for an answer")
    listed = "; ".join(f"{r.request_id} ({r.tool}: {r.summary})" for r in mine)
    raise cli.fail(f"{len(mine)} requests wait, name one: {listed}")


CHOICES: dict[str, Decision] = {"y": "once", "a": "always", "n": "reject"}


async def read_line(prompt: str) -> str:
    """A line from the terminal, read without blocking the event loop (and without a thread
    that would keep the process alive once the watch ends)."""
    print(prompt, end="", flush=True)
    loop, ready = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), ready.set)
    try:
        await ready.wait()
    finally:
        loop.remove_reader(sys.stdin.fileno())
    return sys.stdin.readline().strip()


async def ask_person(
    client: SessionClient, session: str, request: PermissionRequest, note: Callable[[str], None]
) -> None:
    """``watch`` on a terminal: offer a waiting request for an answer (y / a / n, or a
    question's answer); anything else leaves it waiting for ``approve`` / ``deny`` / ``answer``."""
    if request.kind == "question":
        options = f" ({', '.join(request.options)})" if request.options else ""
        text = await read_line(f"answer{options}, or Enter to leave it: ")
        reply: tuple[Decision, str | None] | None = ("once", text) if text else None
    else:
        choice = await read_line("allow? [y]es once, [a]lways, [n]o, Enter to leave it: ")
        decision = CHOICES.get(choice[:1].lower()) if choice else None
        reply = (decision, None) if decision else None
    if reply is None:
        note(f"{request.request_id} still waits: `sessionflow approve|deny|answer {session}`")
        return
    await client.respond(
        session, request.request_id, reply[0], None, answer=reply[1], by=getpass.getuser()
    )


def register(app: typer.Typer, cli: ModuleType) -> None:
    """Add the commands to ``app``, using ``cli``'s helpers (``run``, ``emit``, ...)."""

    def _respond(
        session: str,
        request: str | None,
        decision: Decision,
        *,
        message: str | None = None,
        answer: str | None = None,
        as_json: bool = False,
    ) -> None:
        async def work() -> RespondResult:
            client: SessionClient
            async with cli.session_client() as client:
                kind: RequestKind = "question" if answer is not None else "permission"
                rid = await _pick(cli, client, session, request, kind)
                done = await client.respond(
                    session, rid, decision, message, answer=answer, by=getpass.getuser()
                )
            return done

        result: RespondResult = cli.run(work)
        text = {
            "answered": f"{result.request_id}: {decision}",
            "sent": f"{result.request_id}: {decision} sent; no worker answered, it applies when "
            "one runs",
        }[result.status]
        cli.emit(result.model_dump(), as_json, text)

    @app.command()
    def approve(
        session: str = SESSION,
        request: str | None = REQUEST,
        always: bool = typer.Option(False, "--always", help="Also allow such calls from now on"),
        as_json: bool = JSON,
    ) -> None:
        """Let a waiting call run (the only one waiting, unless REQUEST names it)."""
        _respond(session, request, "always" if always else "once", as_json=as_json)

    @app.command()
    def deny(
        session: str = SESSION,
        request: str | None = REQUEST,
        message: str | None = typer.Option(
            None,
            "--message",
            help="What to do instead (the model reads it and goes on); without it the turn stops",
        ),
        as_json: bool = JSON,
    ) -> None:
        """Refuse a waiting call."""
        _respond(session, request, "reject", message=message, as_json=as_json)

    @app.command()
    def answer(
        session: str = SESSION,
        text: str = typer.Argument(..., help="The answer, as the model will read it"),
        request: str | None = typer.Option(
            None, "--request", help="The question's request id (default: the only one waiting)"
        ),
        as_json: bool = JSON,
    ) -> None:
        """Answer the question the model asked."""
        _respond(session, request, "once", answer=text, as_json=as_json)

    @app.command()
    def agent(
        session: str = SESSION,
        name: str = typer.Argument(..., help="The agent's name (e.g. build, plan)"),
        as_json: bool = JSON,
    ) -> None:
        """Select the session's agent (from its next model turn on)."""

        async def work() -> None:
            async with cli.session_client() as client:
                await client.set_agent(session, name)

        cli.run(work)
        cli.emit({"session": session, "agent": name}, as_json, f"{session}: agent {name}")
