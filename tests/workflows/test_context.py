"""The context baseline (reference §1.6, §8.4, runner cases #4, #7, #8, #18, #19, #21, #22, #31):
frozen on the first step, changes arrive as chronological system messages, rebuilt after a
compaction; sources that cannot be read are no news about them."""

from __future__ import annotations

import json
from typing import Any

from activities.history import DEFAULT_SYSTEM
from store.schema import session_table
from tests.workflows.harness import Harness


def _system_messages(request: dict[str, Any]) -> list[str]:
    return [m["content"][0]["text"] for m in request["messages"] if m["role"] == "system"]


def _instructions(text: str) -> str:
    return f'<instructions source="AGENTS.md">\n{text}\n</instructions>'


async def _turn(h: Harness, sid: str, text: str) -> None:
    await h.client.prompt(sid, text)
    await h.client.wait_idle(sid, timeout=30)


async def test_8_18_one_baseline_and_changes_as_system_messages(h: Harness) -> None:
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session([{"text": "1"}], [{"text": "2"}], [{"text": "3"}])
    await _turn(h, sid, "first")
    (h.workspace / "AGENTS.md").write_text("Changed context")
    await _turn(h, sid, "second")
    (h.workspace / "AGENTS.md").unlink()
    await _turn(h, sid, "third")
    first, second, third = h.requests()
    baseline = [DEFAULT_SYSTEM, _instructions("Initial context")]
    assert first["system"] == second["system"] == third["system"] == baseline
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "system", "user"]
    (changed,) = _system_messages(second)
    assert changed.startswith('The context under "AGENTS.md" changed and supersedes')
    assert "Changed context" in changed
    assert _system_messages(third)[-1] == "System context source removed: AGENTS.md"
    types = await h.types(sid)
    assert types.count("session.instructions.updated") == 2


async def test_19_api_context_entries_through_their_lifecycle(h: Harness) -> None:
    sid = await h.session([{"text": "1"}], [{"text": "2"}], [{"text": "3"}])
    await h.client.set_context(sid, "deploy-target", "production")
    await _turn(h, sid, "first")
    await h.client.set_context(sid, "deploy-target", "staging")
    await _turn(h, sid, "second")
    await h.client.delete_context(sid, "deploy-target")
    await _turn(h, sid, "third")
    first, second, third = h.requests()
    entry = '<context key="deploy-target">\nproduction\n</context>'
    assert first["system"] == [DEFAULT_SYSTEM, entry] == third["system"]
    (changed,) = _system_messages(second)
    assert changed.startswith(
        'The context under "deploy-target" changed and supersedes the previous value:'
    )
    assert _system_messages(third)[-1] == (
        'The context under "deploy-target" no longer applies. Disregard it.'
    )


async def test_22_the_baseline_is_rebuilt_after_a_compaction(h: Harness) -> None:
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session(
        [{"text": "1"}], [{"text": "summary"}], [{"text": "2"}], compaction={"keep_tokens": 0}
    )
    await _turn(h, sid, "first")
    (h.workspace / "AGENTS.md").write_text("Replacement context")
    await h.client.compact(sid)
    await _turn(h, sid, "second")
    requests = h.requests()
    assert requests[2]["system"] == [DEFAULT_SYSTEM, _instructions("Replacement context")]
    assert _system_messages(requests[2]) == []  # folded into the new baseline, not announced


async def test_an_instruction_file_linking_outside_the_workspace_is_not_read(
    h: Harness,
) -> None:
    secret = h.root / "outside.md"
    secret.write_text("TOPSECRET")
    (h.workspace / "AGENTS.md").symlink_to(secret)
    (h.workspace / "CLAUDE.md").write_text("Claude instructions")
    sid = await h.session([{"text": "1"}])
    await _turn(h, sid, "first")
    (request,) = h.requests()
    assert "TOPSECRET" not in str(request)
    assert request["system"] == [
        DEFAULT_SYSTEM,
        '<instructions source="CLAUDE.md">\nClaude instructions\n</instructions>',
    ]


def _away(h: Harness) -> None:
    """The workspace disappears (an unmounted volume, a moved checkout)."""
    h.workspace.rename(h.root / "workspace.away")


def _back(h: Harness) -> None:
    (h.root / "workspace.away").rename(h.workspace)


async def test_4_the_first_turn_waits_for_its_context_to_be_readable(h: Harness) -> None:
    """#4: with the context unreadable, the first turn fails before anything is sent: no
    request, the prompt still pending; once the workspace is back the same prompt runs."""
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session([{"text": "1"}])
    _away(h)
    await h.client.prompt(sid, "first", input_id="msg_first")
    await h.client.wait_idle(sid, timeout=30)
    assert h.requests() == []
    assert [i.id for i in await h.store.inputs.pending(sid)] == ["msg_first"]
    failed = [e for e in await h.events(sid) if e.type == "session.execution.failed"]
    assert "system context of session" in failed[-1].data["error"]["message"]
    _back(h)
    await h.client.prompt(sid, "first", input_id="msg_first")  # the same prompt, once
    await h.client.wait_idle(sid, timeout=30)
    (request,) = h.requests()
    assert h.roles(request) == ["user"]
    assert request["system"] == [DEFAULT_SYSTEM, _instructions("Initial context")]


async def test_21_the_baseline_stays_while_its_sources_cannot_be_read(h: Harness) -> None:
    """#21: the workspace gone after the baseline froze is no news about its sources: the
    next request keeps the baseline and announces no removal."""
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session([{"text": "1"}], [{"text": "2"}], [{"text": "3"}])
    await _turn(h, sid, "first")
    _away(h)
    await _turn(h, sid, "second")
    _back(h)
    await _turn(h, sid, "third")
    first, second, third = h.requests()
    for request in (second, third):
        assert request["system"] == first["system"]
        assert _system_messages(request) == []


async def test_31_after_a_compaction_unseen_sources_rebaseline_as_last_applied(
    h: Harness,
) -> None:
    """#31: a compaction asks for the baseline to be rebuilt; with the sources unreadable it is
    rebuilt from what was last applied, not emptied."""
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session(
        [{"text": "1"}], [{"text": "summary"}], [{"text": "2"}], compaction={"keep_tokens": 0}
    )
    await _turn(h, sid, "first")
    await h.client.compact(sid)
    await h.client.wait_idle(sid, timeout=30)
    _away(h)
    await _turn(h, sid, "second")
    _back(h)
    requests = h.requests()
    assert requests[-1]["system"] == [DEFAULT_SYSTEM, _instructions("Initial context")]
    assert _system_messages(requests[-1]) == []


async def test_7_an_undecodable_applied_record_is_healed_by_announcing_the_context(
    h: Harness,
) -> None:
    """#7: the stored record of what context was applied cannot be decoded: the next request
    keeps the baseline, announces the context again as a system message, and the record is
    healed (the request after that announces nothing)."""
    (h.workspace / "AGENTS.md").write_text("Initial context")
    sid = await h.session([{"text": "1"}], [{"text": "2"}], [{"text": "3"}])
    await _turn(h, sid, "first")
    settings = (await h.store.sessions.get(sid)).settings
    settings["baseline"]["snapshot"] = ["not", "a", "snapshot"]
    async with h.store.db.write() as tx:
        await tx.conn.execute(
            session_table.update()
            .where(session_table.c.id == sid)
            .values(settings=json.dumps(settings))
        )
    await _turn(h, sid, "second")
    await _turn(h, sid, "third")
    first, second, third = h.requests()
    assert second["system"] == first["system"]
    assert h.roles(second) == ["user", "assistant", "system", "user"]
    assert _system_messages(second) == [
        "The system context, announced again:\n" + _instructions("Initial context")
    ]
    assert _system_messages(third) == _system_messages(second)  # healed: nothing new
    healed = (await h.store.sessions.get(sid)).settings["baseline"]["snapshot"]
    assert healed == {"AGENTS.md": "Initial context"}
