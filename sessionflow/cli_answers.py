"""``sessionflow approve | deny | answer | agent``: answering what a session waits for, and
choosing its agent. ``register`` adds them to the main app (``sessionflow/cli.py``), which
passes itself: run as ``python -m sessionflow.cli`` it is ``__main__``, and its options live
there."""

from __future__ import annotations

import getpass
from types import ModuleType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sessionflow.client import SessionClient
    from sessionflow.models.permissions import Decision, RespondResult

SESSION = typer.Argument(..., help="Session id")
REQUEST = typer.Argument(None, help="The waiting request's id (default: the only one waiting)")
JSON = typer.Option(False, "--json", help="Print JSON instead of text")


async def _pick(cli: ModuleType, client: SessionClient, session: str, request: str | None) -> str:
    """The named request, or the only one waiting; several or none is a clear error."""
    if request is not None:
        return request
    waiting = await client.waiting(session)
    if len(waiting) == 1:
        return waiting[0].request_id
    if not waiting:
        raise cli.fail(f"nothing in session {session} waits for an answer")
    listed = "; ".join(f"{r.request_id} ({r.tool}: {r.summary})" for r in waiting)
    raise cli.fail(f"{len(waiting)} requests wait, name one: {listed}")


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
                rid = await _pick(cli, client, session, request)
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
