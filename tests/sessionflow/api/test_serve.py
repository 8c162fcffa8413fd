"""``sessionflow serve`` runs the API on uvloop and httptools when they are installed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvloop  # installed with uvicorn[standard], a dependency
from typer.testing import CliRunner

import sessionflow.api.serve as serve_module
from sessionflow.api.serve import event_loop
from sessionflow.cli import app


def test_serve_runs_in_uvloops_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    assert event_loop() is uvloop.new_event_loop
    loops: list[Any] = []

    async def serve(*args: Any) -> None:  # the command's work, stood in for at its edge
        loops.append(asyncio.get_running_loop())

    monkeypatch.setattr(serve_module, "serve", serve)
    done = CliRunner().invoke(app, ["serve", "--port", "0"])
    assert done.exit_code == 0, done.output
    assert [type(loop) for loop in loops] == [uvloop.Loop]


def test_without_uvloop_serve_runs_in_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_module.importlib.util, "find_spec", lambda name: None)
    assert event_loop() is None
