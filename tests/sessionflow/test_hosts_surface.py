"""Hosts from the outside: ``sessionflow hosts`` / ``GET /hosts``, ``new --host``, ``move`` (CLI
and API), and their errors, against a real worker of host ``b`` (in-process)."""

from __future__ import annotations

from pathlib import Path

import httpx
from temporalio.testing import WorkflowEnvironment

from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import running_api
from store import Store
from tests.sessionflow.test_cli import Cli
from tests.workflows.harness import Harness, harness


async def test_cli_places_lists_and_moves(on_b: tuple[Cli, Harness]) -> None:
    run, h = on_b
    listed = await run.json("hosts")
    assert [(w["host"], w["status"], w["task_queue"]) for w in listed] == [
        ("b", "live", f"{h.client.task_queue}@b")
    ]
    assert "bash" in listed[0]["tools"]
    model = h.script([{"text": "hi"}])
    created = await run.json(
        "new", "--workspace", str(h.workspace), "--model", model, "--host", "b"
    )
    sid = created["session_id"]
    assert (await h.client.session(sid)).host == "b"
    unknown = await run.run("new", "--workspace", str(h.workspace), "--model", model, "--host", "c")
    assert unknown.returncode == 1 and "host `c` has never registered" in unknown.stderr
    assert "Traceback" not in unknown.stderr
    other = h.root / "other"
    other.mkdir()
    moved = await run.json("move", sid, "--host", "b", "--workspace", str(other))
    assert moved == {"session_id": sid, "host": "b", "directory": str(other)}
    missing = await run.run("move", sid, "--host", "b", "--workspace", str(h.root / "nope"))
    assert missing.returncode == 1 and "nope" in missing.stderr, missing.stderr
    assert (await h.client.session(sid)).directory == str(other)  # a refused move changes nothing


async def test_api_lists_hosts_and_moves_sessions(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with (
        harness(temporal_env.client, store, tmp_path, host="b") as h,
        running_api(h.client, ApiSettings(port=0)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        hosts = (await http.get("/hosts")).json()
        assert [(w["host"], w["status"]) for w in hosts] == [("b", "live")]
        body = {"workspace": str(h.workspace), "model": h.script([{"text": "x"}]), "host": "b"}
        created = await http.post("/sessions", json=body)
        assert created.status_code == 201 and created.json()["host"] == "b", created.text
        sid = created.json()["id"]
        refused = await http.post(f"/sessions/{sid}/move", json={"host": "ci-3"})
        assert refused.status_code == 422
        assert refused.json()["error"]["type"] == "UnknownHostError"
        relative = await http.post(f"/sessions/{sid}/move", json={"host": "b", "workspace": "w"})
        assert relative.status_code == 422 and "absolute" in relative.text
        other = h.root / "other"
        other.mkdir()
        moved = await http.post(
            f"/sessions/{sid}/move", json={"host": "b", "workspace": str(other)}
        )
        assert moved.status_code == 200, moved.text
        assert moved.json()["directory"] == str(other)
        assert (await h.client.session(sid)).directory == str(other)
