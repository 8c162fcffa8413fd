"""SessionClient.create_session checks at the edge what the CLI's `new` checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from sessionflow.client import SessionClient
from sessionflow.errors import InvalidInputError
from store import Store


async def test_create_session_resolves_and_checks_workspace_and_model(
    temporal_env: WorkflowEnvironment,
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = SessionClient(temporal_env.client, store, task_queue="unused")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "model.json").write_text(json.dumps({"turns": []}))
    monkeypatch.chdir(tmp_path)
    sid = await client.create_session(workspace="proj", model="scripted/proj/model.json")
    info = await client.session(sid)
    assert info.directory == str(tmp_path / "proj")
    assert str(info.model) == f"scripted/{tmp_path / 'proj' / 'model.json'}"
    refused = {
        ("proj/model.json", "scripted/proj/model.json"): "is not a directory",
        ("missing", "scripted/proj/model.json"): "does not exist",
        ("proj", "foo/bar"): "Unknown model provider 'foo'",
        ("proj", "scripted/nope.json"): "Scripted model file not found",
    }
    for (workspace, model), message in refused.items():
        with pytest.raises(InvalidInputError, match=message):
            await client.create_session(workspace=workspace, model=model)
    assert [s.id for s in await client.list_sessions()] == [sid]


async def test_a_task_queue_look_the_server_answers_late_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A describe of the task queue that the server does not answer in time (a busy dev
    server: ``operation was canceled``) is not "no worker": the client asks again, a few
    times; any other failure, or one slow answer too many, is raised."""
    from temporalio.service import RPCError, RPCStatusCode

    from sessionflow import client as module

    answers: list[int | RPCError] = []

    async def workers(_self: SessionClient, _queue: str | None = None) -> int:
        answer = answers.pop(0)
        if isinstance(answer, RPCError):
            raise answer
        return answer

    monkeypatch.setattr(SessionClient, "workers", workers)
    sdk = SessionClient.__new__(SessionClient)
    sdk._unpolled = {}
    late = RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")
    answers[:] = [late, late, 1]
    assert await sdk._polled("q") is True
    answers[:] = [late] * module.SLOW_ANSWER_TRIES
    with pytest.raises(RPCError):
        await sdk._polled("q")
    answers[:] = [RPCError("denied", RPCStatusCode.PERMISSION_DENIED, b"")]
    with pytest.raises(RPCError):
        await sdk._polled("q")
