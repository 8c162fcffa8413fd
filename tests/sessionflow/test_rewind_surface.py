"""Rewind from the outside: ``sessionflow revert`` / ``unrevert`` / ``fork`` (dry run,
refusal, force) on a session whose tools run on host ``b`` (they run on that host's queue),
and ``POST /sessions/{id}/revert`` / ``unrevert`` / ``fork`` with their 409 refusals."""

from __future__ import annotations

from pathlib import Path

import httpx
from temporalio.testing import WorkflowEnvironment

from sessionflow.api.config import ApiSettings
from sessionflow.api.serve import running_api
from store import Store
from tests.sessionflow.test_cli import Cli
from tests.workflows.harness import Harness, call, harness


async def test_cli_reverts_on_the_sessions_host(on_b: tuple[Cli, Harness]) -> None:
    run, h = on_b
    sid = await h.session(
        [call("w1", "write", path="notes.txt", content="line one\nline two\n")],
        [{"text": "written"}],
        host="b",
    )
    receipt = await h.client.prompt(sid, "write it")
    await h.client.wait_idle(sid, timeout=60)
    notes = h.workspace / "notes.txt"
    assert "written" in str(await run.json("show", sid))

    dry = await run.run("revert", sid, receipt.id, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "delete   notes.txt  (+0 -2)" in dry.stdout and "dry run" in dry.stdout
    assert notes.exists()

    notes.write_text("edited by hand\n")
    refused = await run.run("revert", sid, receipt.id)
    assert refused.returncode == 1, refused.stdout
    assert "refused notes.txt" in refused.stdout and "--force notes.txt" in refused.stdout
    assert notes.read_text() == "edited by hand\n"

    done = await run.json("revert", sid, receipt.id, "--force", "notes.txt")
    assert done["applied"] and not notes.exists()
    shown = await run.json("show", sid)
    assert "written" not in str(shown)  # the answer is hidden
    watched = await run.run("watch", sid, "--until-idle")
    assert f"reverted to {receipt.id}: notes.txt" in watched.stdout, watched.stdout
    back = await run.json("unrevert", sid)
    assert back["applied"] and notes.read_text() == "edited by hand\n"
    again = await run.run("unrevert", sid)
    assert again.returncode == 1 and "nothing to unrevert" in again.stdout
    assert "Traceback" not in again.stderr

    (h.workspace / "AGENTS.md").write_text("be brief\n")
    copy = h.root / "forked"
    forked = await run.run("fork", sid, receipt.id, str(copy))  # on host b, as the session
    assert forked.returncode == 0, forked.stdout + forked.stderr
    assert f"forked {sid} at {receipt.id}" in forked.stdout and not (copy / "notes.txt").exists()
    assert (copy / "AGENTS.md").read_text() == "be brief\n"
    fid = forked.stdout.rsplit(": ", 1)[1].split()[0]
    info = await h.client.store.sessions.get(fid)
    assert info.host == "b" and info.directory == str(copy)
    assert info.settings["observed"] == {"AGENTS.md": "be brief\n"}  # read on host b
    watched = await run.run("watch", fid, "--until-idle")
    assert "you write it" in watched.stdout, watched.stdout  # the fork's copied history
    watched = await run.run("watch", sid, "--until-idle")
    assert f"forked at {receipt.id}: {fid}" in watched.stdout, watched.stdout
    taken = await run.run("fork", sid, receipt.id, str(copy))
    assert taken.returncode == 1 and "already exists" in taken.stdout
    relative = await run.run("fork", sid, receipt.id, "elsewhere")
    assert relative.returncode != 0 and "absolute path on host b" in relative.stderr


async def test_api_reverts_and_answers_409_when_refused(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with (
        harness(temporal_env.client, store, tmp_path) as h,
        running_api(h.client, ApiSettings(port=0)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):
        sid = await h.session(
            [call("w1", "write", path="a.txt", content="a\n")], [{"text": "written"}]
        )
        receipt = await h.client.prompt(sid, "write it")
        await h.client.wait_idle(sid, timeout=60)
        unknown = await http.post(f"/sessions/{sid}/revert", json={"message_id": "msg_x"})
        assert unknown.status_code == 409 and "no message" in unknown.json()["refused"]
        dry = await http.post(
            f"/sessions/{sid}/revert", json={"message_id": receipt.id, "dry_run": True}
        )
        assert dry.status_code == 200 and not dry.json()["applied"]
        assert (h.workspace / "a.txt").exists()
        done = await http.post(f"/sessions/{sid}/revert", json={"message_id": receipt.id})
        assert done.status_code == 200 and done.json()["applied"], done.text
        assert not (h.workspace / "a.txt").exists()
        shown = (await http.get(f"/sessions/{sid}/messages")).json()
        assert [m["id"] for m in shown] == [receipt.id]
        everything = (await http.get(f"/sessions/{sid}/messages?hidden=true")).json()
        assert len(everything) > 1
        back = await http.post(f"/sessions/{sid}/unrevert", json={})
        assert back.status_code == 200 and (h.workspace / "a.txt").read_text() == "a\n"
        bad = await http.post(f"/sessions/{sid}/revert", json={})
        assert bad.status_code == 422
        body = {"message_id": receipt.id, "workspace": str(tmp_path / "forked")}
        forked = await http.post(f"/sessions/{sid}/fork", json=body)
        assert forked.status_code == 200 and forked.json()["applied"], forked.text
        fid = forked.json()["fork_session_id"]
        assert [m["type"] for m in (await http.get(f"/sessions/{fid}/messages")).json()] == ["user"]
        again = await http.post(f"/sessions/{sid}/fork", json=body)
        assert again.status_code == 409 and "already exists" in again.json()["refused"]
        relative = await http.post(f"/sessions/{sid}/fork", json={**body, "workspace": "x"})
        assert relative.status_code == 422
