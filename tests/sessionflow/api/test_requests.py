"""Permission asks and questions over HTTP, the agent route, and the answers when no worker runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from store import Store
from tests.sessionflow.api.conftest import Api
from tests.sessionflow.api.test_guard import served
from tests.sessionflow.api.test_routes import error
from tests.workflows.harness import call, harness


async def waiting(api: Api, sid: str) -> list[dict[str, Any]]:
    """The requests waiting, once one is."""
    await api.h.until(lambda: _any_waiting(api, sid), timeout=30)
    answer = await api.http.get(f"/sessions/{sid}/waiting")
    assert answer.status_code == 200, answer.text
    listed: list[dict[str, Any]] = answer.json()
    return listed


async def _any_waiting(api: Api, sid: str) -> bool:
    return bool((await api.http.get(f"/sessions/{sid}/waiting")).json())


async def test_a_waiting_call_is_approved_over_http(api: Api) -> None:
    ran = api.h.workspace / "ran.txt"
    sid = await api.session([call("b1", "bash", command="touch ran.txt")], [{"text": "done"}])
    assert (await api.http.get(f"/sessions/{sid}/waiting")).json() == []
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Go"})
    (request,) = await waiting(api, sid)
    assert (request["tool"], request["summary"]) == ("bash", "touch ran.txt")
    assert not ran.exists()
    url = f"/sessions/{sid}/requests/{request['request_id']}/reply"
    maybe = await api.http.post(url, json={"decision": "maybe"})
    error(maybe, 422, "InvalidInputError", "decision")
    answer = await api.http.post(url, json={"decision": "once", "by": "alice"})
    assert answer.json() == {"status": "answered", "request_id": request["request_id"]}
    await api.h.client.wait_idle(sid, timeout=30)
    assert ran.exists()
    # A repeat is answered once, as the SDK's is (the update's id is the request id).
    again = await api.http.post(url, json={"decision": "reject"})
    assert again.json() == answer.json()
    replied = [e for e in await api.h.events(sid) if e.type == "session.permission.replied"]
    assert [(e.data["decision"], e.data["by"]) for e in replied] == [("once", "alice")]


async def test_a_denial_with_a_message_is_a_correction(api: Api) -> None:
    sid = await api.session([call("b1", "bash", command="touch x")], [{"text": "ok"}])
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Go"})
    (request,) = await waiting(api, sid)
    url = f"/sessions/{sid}/requests/{request['request_id']}/reply"
    body = {"decision": "reject", "message": "Use another tool"}
    assert (await api.http.post(url, json=body)).json()["status"] == "answered"
    await api.h.client.wait_idle(sid, timeout=30)
    assert not (api.h.workspace / "x").exists()
    assert (await api.h.types(sid))[-1] == "session.execution.succeeded"


async def test_a_question_is_answered_over_http(api: Api) -> None:
    question = call("q1", "question", question="Which branch?", options=["main", "dev"])
    sid = await api.session([question], [{"text": "ok"}])
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Go"})
    (request,) = await waiting(api, sid)
    assert (request["kind"], request["question"]) == ("question", "Which branch?")
    url = f"/sessions/{sid}/requests/{request['request_id']}/answer"
    assert (await api.http.post(url, json={"text": "dev"})).json()["status"] == "answered"
    await api.h.client.wait_idle(sid, timeout=30)
    assert api.h.requests()[1]["messages"][-1]["content"][0]["output"] == "dev"


async def test_each_reply_only_for_its_kind_of_request(api: Api) -> None:
    """Issue 32: an answer approved a waiting shell command, which ran; an approval of a
    question failed as if nothing could be reached. Each is refused, saying what waits."""
    sid = await api.session(
        [
            call("b1", "bash", command="touch ran.txt"),
            call("q1", "question", question="Which branch?"),
        ],
        [{"text": "ok"}],
    )
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Go"})
    await api.h.until(lambda: _count_waiting(api, sid, 2), timeout=30)
    kinds = {r["kind"]: r["request_id"] for r in await waiting(api, sid)}
    ask, question = kinds["permission"], kinds["question"]
    answered = await api.http.post(f"/sessions/{sid}/requests/{ask}/answer", json={"text": "y"})
    message = error(answered, 422, "WrongRequestKindError", "request_id")
    assert "a permission ask, not a question (bash: touch ran.txt)" in message
    assert f"sessionflow approve {sid} {ask}" in message
    approved = await api.http.post(
        f"/sessions/{sid}/requests/{question}/reply", json={"decision": "once"}
    )
    message = error(approved, 422, "WrongRequestKindError", "request_id")
    assert "a question, not a permission ask ('Which branch?')" in message
    assert f"sessionflow answer {sid} TEXT --request {question}" in message
    assert not (api.h.workspace / "ran.txt").exists()
    assert len(await waiting(api, sid)) == 2  # both still wait: nothing was sent
    ok = await api.http.post(f"/sessions/{sid}/requests/{question}/answer", json={"text": "dev"})
    assert ok.json()["status"] == "answered"
    ok = await api.http.post(f"/sessions/{sid}/requests/{ask}/reply", json={"decision": "once"})
    assert ok.json()["status"] == "answered"
    await api.h.client.wait_idle(sid, timeout=30)
    assert (api.h.workspace / "ran.txt").exists()


async def _count_waiting(api: Api, sid: str, count: int) -> bool:
    return len((await api.http.get(f"/sessions/{sid}/waiting")).json()) == count


async def test_requests_and_agents_refuse_what_does_not_exist(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    reply = {"decision": "once"}
    unknown = await api.http.post(f"/sessions/{sid}/requests/req_nope/reply", json=reply)
    assert "req_nope" in error(unknown, 404, "RequestNotWaitingError")
    hostile = await api.http.post(f"/sessions/{sid}/requests/req;drop/reply", json=reply)
    assert "Invalid request id" in error(hostile, 422, "InvalidIdError", "request_id")
    missing = await api.http.post("/sessions/ses_nope/requests/req_1/reply", json=reply)
    error(missing, 404, "SessionNotFoundError")
    error(await api.http.get("/sessions/ses_nope/waiting"), 404, "SessionNotFoundError")
    bad = await api.http.post(f"/sessions/{sid}/agent", json={"agent": "wizard"})
    assert "wizard" in error(bad, 422, "UnknownAgentError", "agent")
    plan = await api.http.post(f"/sessions/{sid}/agent", json={"agent": "plan"})
    assert plan.status_code == 204
    assert (await api.h.types(sid))[-1] == "session.agent.selected"
    created = await api.http.post(
        "/sessions",
        json={"workspace": str(api.h.workspace), "model": "scripted/x", "agent": "wizard"},
    )
    error(created, 422, "UnknownAgentError", "agent")


async def test_session_settings_carry_permissions_network_and_approval_timeout(api: Api) -> None:
    body = {
        "workspace": str(api.h.workspace),
        "model": api.h.script([{"text": "x"}]),
        "agent": "plan",
        "settings": {
            "permissions": [{"tool": "bash", "pattern": "git *", "action": "allow"}],
            "network": True,
            "approval_timeout": 30,
        },
    }
    created = await api.http.post("/sessions", json=body)
    assert created.status_code == 201, created.text
    settings = created.json()["settings"]
    assert settings["permissions"] == [{"tool": "bash", "pattern": "git *", "action": "allow"}]
    assert (settings["network"], settings["approval_timeout"]) == (True, 30)
    assert created.json()["agent"] == "plan"


async def test_no_worker_is_503_with_the_error_shape(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        sid = await h.session([{"text": "x"}])
        async with served(h.client) as http:
            answer = await http.post(f"/sessions/{sid}/resume", params={"timeout": 30})
            message = error(answer, 503, "NoWorkerError")
            assert h.client.task_queue in message and "sessionflow worker" in message
            assert answer.headers["retry-after"] == "1"
            status = (await http.get(f"/sessions/{sid}/status")).json()
            assert status["busy"] is False and status["waiting_for_worker"] is None
