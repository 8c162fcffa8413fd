"""Every route over real HTTP on both databases: what it answers, and the error for each misuse."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sessionflow.api.conftest import Api


def error(answer: Any, status: int, type_: str, field: str | None = None) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()["error"]
    assert body["type"] == type_, body
    if field is not None:
        assert body["field"] == field, body
    message: str = body["message"]
    return message


async def test_create_read_list_and_messages(api: Api) -> None:
    model = api.h.script([{"text": "Hello over HTTP", "chunks": 3}])
    body = {
        "workspace": str(api.h.workspace),
        "model": model,
        "title": "over http",
        "settings": {"max_active_tools": 3, "max_steps": 5},
    }
    created = await api.http.post("/sessions", json=body)
    assert created.status_code == 201, created.text
    info = created.json()
    sid = info["id"]
    assert created.headers["location"] == f"/sessions/{sid}"
    assert info["model"] == {
        "provider_id": "scripted",
        "id": model.split("/", 1)[1],
        "variant": None,
    }
    assert info["settings"] == {"max_active_tools": 3, "max_steps": 5}
    assert (await api.http.get(f"/sessions/{sid}")).json() == info
    listed = (await api.http.get("/sessions", params={"search": "OVER"})).json()
    assert [s["id"] for s in listed] == [sid]
    assert (await api.http.get("/sessions", params={"search": "nothing"})).json() == []
    assert len((await api.http.get("/sessions", params={"limit": 1})).json()) == 1
    since = await api.http.get("/sessions", params={"updated_since": info["time_updated"] + 1})
    assert since.json() == []
    assert [s["id"] for s in (await api.http.get("/sessions?roots=true")).json()] == [sid]
    prompt = await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Say hello"})
    assert prompt.json()["delivery"] == "steer"
    await api.h.client.wait_idle(sid)
    messages = (await api.http.get(f"/sessions/{sid}/messages")).json()
    assert [m["type"] for m in messages] == ["user", "assistant"]
    assert messages[0]["text"] == "Say hello"
    assert messages[1]["content"][0]["text"] == "Hello over HTTP"


async def test_prompt_is_idempotent_by_input_id(api: Api) -> None:
    """Catalogue S9: a duplicate prompt or start."""
    sid = await api.session([{"text": "once"}])
    body = {"text": "Run once", "input_id": "msg_http_1", "delivery": "queue", "wake": False}
    first = await api.http.post(f"/sessions/{sid}/prompt", json=body)
    again = await api.http.post(f"/sessions/{sid}/prompt", json=body)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert first.json()["id"] == "msg_http_1" and first.json()["delivery"] == "queue"
    changed = await api.http.post(f"/sessions/{sid}/prompt", json={**body, "text": "Other"})
    assert "msg_http_1" in error(changed, 409, "InputConflictError")
    admitted = [e for e in await api.h.events(sid) if e.type == "session.prompt.admitted"]
    assert len(admitted) == 1
    status = (await api.http.get(f"/sessions/{sid}/status")).json()
    assert status["pending_inputs"] == 1 and status["busy"] is False


async def test_resume_returns_the_outcome_or_202_while_it_runs(api: Api) -> None:
    gate = api.h.gate_file("resume")
    # A second turn: had the first busy period ended before the second resume reached the
    # workflow, that resume forces a fresh drain, which asks the model again.
    sid = await api.session([{"wait_for_file": gate}, {"text": "resumed"}], [{"text": "again"}])
    waiting = await api.http.post(f"/sessions/{sid}/resume", params={"timeout": 0.2})
    assert waiting.status_code == 202 and waiting.json() == {"done": False, "outcome": None}
    api.h.open_gate("resume")
    done = await api.http.post(f"/sessions/{sid}/resume", params={"timeout": 30})
    assert done.status_code == 200, done.text
    assert done.json()["done"] is True
    # The first request's busy period, joined; or, had it already ended, a fresh one.
    assert done.json()["outcome"]["type"] == "succeeded", done.json()


async def test_interrupt_and_status(api: Api) -> None:
    gate = api.h.gate_file("never")
    sid = await api.session([{"text": "working", "chunks": 2}, {"wait_for_file": gate}])
    idle = await api.http.post(f"/sessions/{sid}/interrupt")
    assert idle.json() == {"status": "idle", "detail": None}
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "go"})
    await api.h.until(lambda: _phase(api, sid))
    status = (await api.http.get(f"/sessions/{sid}/status")).json()
    assert status["busy"] is True and status["drain"]["execution_id"]
    stopped = await api.http.post(f"/sessions/{sid}/interrupt", json={"reason": "user"})
    assert stopped.status_code == 200 and stopped.json() == {"status": "stopped", "detail": None}
    await api.h.client.wait_idle(sid)
    assert (await api.h.types(sid))[-1] == "session.execution.interrupted"
    assert (await api.http.get(f"/sessions/{sid}/status")).json()["busy"] is False


async def _phase(api: Api, sid: str) -> bool:
    return any(e.type == "session.text.delta" for e in await api.h.events(sid))


async def test_openapi_docs_and_health(api: Api) -> None:
    schema = (await api.http.get("/openapi.json")).json()
    paths = set(schema["paths"])
    assert {
        "/sessions",
        "/sessions/{session_id}",
        "/sessions/{session_id}/messages",
        "/sessions/{session_id}/prompt",
        "/sessions/{session_id}/resume",
        "/sessions/{session_id}/interrupt",
        "/sessions/{session_id}/status",
        "/sessions/{session_id}/events",
        "/sessions/{session_id}/compact",
        "/sessions/{session_id}/waiting",
        "/sessions/{session_id}/requests/{request_id}/reply",
        "/sessions/{session_id}/requests/{request_id}/answer",
        "/sessions/{session_id}/agent",
    } <= paths
    assert "ErrorBody" in schema["components"]["schemas"]
    assert (await api.http.get("/docs")).status_code == 200
    assert (await api.http.get("/healthz")).json() == {
        "store": True,
        "temporal": True,
        "streams": 0,
        "followers": 0,
        "held_bytes": 0,
    }


async def test_unknown_sessions_are_404_on_every_route(api: Api) -> None:
    missing = "ses_doesnotexist"
    for method, path in ROUTES:
        answer = await api.http.request(method, path.format(missing), json=BODIES.get(path))
        assert missing in error(answer, 404, "SessionNotFoundError"), (method, path)
    assert error(await api.http.get("/nowhere"), 404, "NotFoundError")
    assert error(await api.http.delete("/sessions"), 405, "MethodNotAllowedError")


ROUTES = [
    ("GET", "/sessions/{}"),
    ("GET", "/sessions/{}/messages"),
    ("GET", "/sessions/{}/status"),
    ("GET", "/sessions/{}/events"),
    ("POST", "/sessions/{}/prompt"),
    ("POST", "/sessions/{}/resume"),
    ("POST", "/sessions/{}/interrupt"),
    ("POST", "/sessions/{}/compact"),
    ("GET", "/sessions/{}/waiting"),
    ("POST", "/sessions/{}/requests/req_1/reply"),
    ("POST", "/sessions/{}/requests/req_1/answer"),
    ("POST", "/sessions/{}/agent"),
]
BODIES = {
    "/sessions/{}/prompt": {"text": "hi"},
    "/sessions/{}/requests/req_1/reply": {"decision": "once"},
    "/sessions/{}/requests/req_1/answer": {"text": "yes"},
    "/sessions/{}/agent": {"agent": "plan"},
}

HOSTILE = [
    "' OR 1=1 --",
    "ses_\u00e9",
    "a" * 129,
    "ses_x;DROP TABLE session",
    "ses x",
    "%00",
    "ses_..",
    "ses_%2F..",
    "ses_\U0001f600",
]


async def test_hostile_ids_are_refused_at_the_edge(api: Api) -> None:
    """Catalogue D3: hostile session ids."""
    sid = await api.session([{"text": "x"}])
    before = await api.h.events(sid)
    for hostile in HOSTILE:
        for method, path in ROUTES:
            answer = await api.http.request(method, path.format(hostile), json=BODIES.get(path))
            # An id that is not one path segment (an encoded slash) never reaches a route.
            if answer.status_code == 404:
                error(answer, 404, "NotFoundError")
            else:
                assert "Invalid session id" in error(answer, 422, "InvalidIdError", "session_id")
        prompt = await api.http.post(
            f"/sessions/{sid}/prompt", json={"text": "x", "input_id": hostile}
        )
        assert "Invalid input id" in error(prompt, 422, "InvalidIdError", "input_id")
        created = await api.http.post(
            "/sessions", json={"workspace": "/tmp", "model": "scripted/x", "session_id": hostile}
        )
        error(created, 422, "InvalidIdError", "session_id")
    assert await api.h.events(sid) == before
    assert [s["id"] for s in (await api.http.get("/sessions")).json()] == [sid]


BAD_SESSIONS: list[tuple[dict[str, Any], str]] = [
    ({"model": "scripted/x"}, "workspace"),
    ({"workspace": "relative/dir", "model": "scripted/x"}, "workspace"),
    ({"workspace": "/tmp", "model": "no-provider"}, "model"),
    (
        {"workspace": "/tmp", "model": "scripted/x", "settings": {"max_active_tools": 0}},
        "settings.max_active_tools",
    ),
    ({"workspace": "/tmp", "model": "scripted/x", "colour": "red"}, "colour"),
    # Checked when the session is created, as the SDK does.
    # (after the model, which is checked where the call is made: a model that needs nothing)
    ({"workspace": "/nonexistent/dir", "model": "openai-chat/llama3"}, "workspace"),
    ({"workspace": "/etc/hostname", "model": "openai-chat/llama3"}, "workspace"),
    ({"workspace": "/tmp", "model": "nope/x"}, "model"),
    ({"workspace": "/tmp", "model": "scripted//nonexistent/model.json"}, "model"),
]


async def test_bad_session_bodies_name_the_field(api: Api) -> None:
    for body, field in BAD_SESSIONS:
        error(await api.http.post("/sessions", json=body), 422, "InvalidInputError", field)
    assert (await api.http.get("/sessions")).json() == []


async def test_bad_prompts_name_the_field(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    url = f"/sessions/{sid}/prompt"
    error(
        await api.http.post(url, json={"text": "x", "delivery": "now"}),
        422,
        "InvalidInputError",
        "delivery",
    )
    error(await api.http.post(url, json={}), 422, "InvalidInputError", "text")
    error(
        await api.http.post(
            url, content=b"{not json", headers={"content-type": "application/json"}
        ),
        422,
        "InvalidInputError",
    )
    # A body that is not declared JSON is never parsed as JSON (a cross-site form cannot post).
    error(
        await api.http.post(url, content=b'{"text": "x"}', headers={"content-type": "text/plain"}),
        422,
        "InvalidInputError",
    )
    lone = await api.http.post(
        url, content=b'{"text": "bad \\ud800 text"}', headers={"content-type": "application/json"}
    )
    assert "lone surrogate" in error(lone, 422, "UnencodableTextError")
    error(await api.http.get("/sessions", params={"limit": 0}), 422, "InvalidInputError", "limit")
    error(
        await api.http.post(f"/sessions/{sid}/resume", params={"timeout": -1}),
        422,
        "InvalidInputError",
        "timeout",
    )
    assert [e.type for e in await api.h.events(sid)] == ["session.created"]


async def test_oversized_bodies_are_refused_before_they_are_read(api: Api) -> None:
    sid = await api.session([{"text": "x"}])
    url = f"/sessions/{sid}/prompt"
    cap = 8 * 1024 * 1024
    huge = b'{"text": "' + b"x" * cap + b'"}'
    message = error(
        await api.http.post(url, content=huge, headers={"content-type": "application/json"}),
        413,
        "PayloadTooLargeError",
    )
    assert str(cap) in message and "raise SESSIONFLOW_API_MAX_BODY_BYTES" in message

    async def chunks() -> Any:  # no Content-Length: the cap applies as the body arrives
        yield b'{"text": "'
        for _ in range(9):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    chunked = await api.http.post(
        url, content=chunks(), headers={"content-type": "application/json"}
    )
    error(chunked, 413, "PayloadTooLargeError")
    # Under the body cap but over the store's event cap (4 MiB): the store refuses it.
    big = await api.http.post(url, json={"text": "y" * (5 * 1024 * 1024)})
    assert "raise SESSIONFLOW_MAX_EVENT_BYTES" in error(big, 413, "PayloadTooLargeError")
    assert [e.type for e in await api.h.events(sid)] == ["session.created"]


async def test_compact_summarizes_at_the_next_boundary(api: Api) -> None:
    model = api.h.script([{"text": "first answer"}], [{"text": "the summary"}])
    body = {
        "workspace": str(api.h.workspace),
        "model": model,
        "settings": {"compaction": {"keep_tokens": 20, "buffer": 0}},
    }
    sid = (await api.http.post("/sessions", json=body)).json()["id"]
    assert (await api.http.get(f"/sessions/{sid}")).json()["settings"]["compaction"]["buffer"] == 0
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "One"})
    await api.h.client.wait_idle(sid)
    first = await api.http.post(f"/sessions/{sid}/compact")
    assert first.status_code == 202, first.text
    await api.h.client.wait_idle(sid)
    messages = (await api.http.get(f"/sessions/{sid}/messages")).json()
    (compaction,) = [m for m in messages if m["type"] == "compaction"]
    assert compaction["id"] == first.json()["input_id"]
    assert (compaction["status"], compaction["summary"]) == ("completed", "the summary")
    error(await api.http.post("/sessions/ses_nope/compact"), 404, "SessionNotFoundError")


async def test_a_budget_is_set_read_and_reached_over_http(api: Api) -> None:
    model = api.h.script(
        [{"text": "spent"}, {"finish": {"reason": "stop", "usage": {"input": 2000}}}],
        price={"input": 1000.0, "output": 1000.0},
    )
    body = {"workspace": str(api.h.workspace), "model": model, "budget": {"usd": 5}}
    created = await api.http.post("/sessions", json=body)
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    assert created.json()["budget"] == {"usd": 5.0, "tokens": None}
    answer = await api.http.put(f"/sessions/{sid}/budget", json={"usd": 1.5, "tokens": 10})
    assert answer.status_code == 200 and answer.json()["budget"] == {"usd": 1.5, "tokens": 10}
    await api.http.post(f"/sessions/{sid}/prompt", json={"text": "Go"})
    await api.h.client.wait_idle(sid, timeout=30)
    status = (await api.http.get(f"/sessions/{sid}/status")).json()
    assert status["spend"]["cost"] == pytest.approx(2.0)
    assert status["spend"]["priced_steps"] == 1
    assert status["budget_reached"] == {"limit": "usd", "allowed": 1.5, "spent": 2.0}
    refused = await api.http.put(f"/sessions/{sid}/budget", json={"usd": -1})
    assert refused.status_code == 422 and "usd" in refused.text
    cleared = await api.http.put(f"/sessions/{sid}/budget", json={})
    assert cleared.json()["budget"] is None
