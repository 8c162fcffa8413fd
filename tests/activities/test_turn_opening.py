"""A turn's opening (``TurnActivities._begin``): one fenced transaction, few statements.

Issue 14 item 3: on PostgreSQL every statement is a round trip. The opening renews the claim and
records the in-flight phase in one statement, reads the session with what waits to be promoted
in one more, and counts the request: three statements when nothing waits (it took six). What it
promotes is unchanged: a steer and a queued prompt are promoted, nothing behind a compaction.
The store is real, on both databases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.runtime import Runtime
from activities.tools import testing as tools
from activities.turn import TurnActivities
from sessionflow.models.common import ModelRef
from sessionflow.models.drain import TurnInput
from store import Store
from store.claims import Claim
from tests.conftest import Target
from tests.store.helpers import round_trips, rows, statements

MESSAGE = "msg_turn"


async def _session(store: Store, root: Path) -> tuple[str, Claim]:
    script = root / "model.json"
    script.write_text(json.dumps({"turns": [{"events": [{"text": "hi"}]}]}))
    session = await store.sessions.create(str(root), model=ModelRef.parse(f"scripted/{script}"))
    return session.id, await store.claims.acquire(session.id, "exec_a", "owner")


def _request(claim: Claim, promotion: Any = "steer") -> TurnInput:
    from activities.runtime import to_ref

    return TurnInput(
        claim=to_ref(claim), assistant_message_id=MESSAGE, step=2, attempt=1, promotion=promotion
    )


async def _begin(store: Store, claim: Claim, promotion: Any = "steer") -> Any:
    turn = TurnActivities(Runtime(store, tools.testing_registry()))
    return await turn._begin(claim, _request(claim, promotion))


async def _claim_row(store: Store, sid: str) -> tuple[str, str | None, int]:
    ((phase, mid, attempt),) = await rows(
        store,
        "SELECT phase, assistant_message_id, step_attempt FROM session_execution "
        "WHERE session_id = :sid",
        sid=sid,
    )
    return str(phase), mid, int(attempt)


async def test_an_opening_with_nothing_pending_takes_two_statements(
    store: Store, tmp_path: Path
) -> None:
    sid, claim = await _session(store, tmp_path)
    with round_trips() as sent:
        begun = await _begin(store, claim)
    assert (begun.step, begun.index) == (2, 0)
    assert begun.basis.seq == await store.events.latest_sequence(sid)
    assert await _claim_row(store, sid) == ("unknown", MESSAGE, 1)
    if store.db.dialect == "postgresql":
        # the session with what waits and its claim row's version; the fence recording the
        # phase with the request's count (a transaction of five before)
        assert len(sent) == 2, sent
    assert (await _begin(store, claim)).index == 1


async def test_an_opening_with_a_fenced_write_after_its_read_takes_the_general_path(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fenced write (here a renewal) between the opening's read and its write: the write
    refuses, nothing is counted twice, and the general path opens the turn."""
    sid, claim = await _session(store, tmp_path)
    read = store.sessions.turn_snapshot

    async def then_renewed(session_id: str, message_id: str) -> Any:
        snapshot = await read(session_id, message_id)
        await store.claims.renew(claim)
        return snapshot

    monkeypatch.setattr(store.sessions, "turn_snapshot", then_renewed)
    with statements(store) as general:
        begun = await _begin(store, claim)
    assert begun.index == 0  # counted once
    assert await _claim_row(store, sid) == ("unknown", MESSAGE, 1)
    if store.db.dialect == "postgresql":
        assert len(general) >= 3, general  # renew + phase; the session; the request count


async def test_an_opening_promotes_the_queued_prompt_then_the_steers(
    store: Store, tmp_path: Path
) -> None:
    sid, claim = await _session(store, tmp_path)
    queued = await store.inputs.admit(sid, "first queued", delivery="queue")
    await store.inputs.admit(sid, "second queued", delivery="queue")
    steer = await store.inputs.admit(sid, "steer", delivery="steer")
    begun = await _begin(store, claim, "queue")
    assert begun.step == 1
    pending = {r.id for r in await store.inputs.pending(sid)}
    assert queued.id not in pending and steer.id not in pending and len(pending) == 1
    assert await _claim_row(store, sid) == ("unknown", MESSAGE, 1)
    # What the step starts on: the log as the opening left it, its promotions included.
    assert begun.basis.seq == await store.events.latest_sequence(sid)
    assert (begun.basis.exists, begun.basis.latest) == (False, None)


async def test_an_opening_promotes_nothing_behind_a_compaction(
    store: Store, tmp_path: Path
) -> None:
    sid, claim = await _session(store, tmp_path)
    await store.inputs.admit_compaction(sid)
    await store.inputs.admit(sid, "steer", delivery="steer")
    begun = await _begin(store, claim, "queue")
    assert begun.step == 2
    assert len(await store.inputs.pending(sid)) == 2


async def test_an_opening_that_weighs_its_history_reads_in_its_own_transaction(
    target: Target, tmp_path: Path
) -> None:
    """F6: with auto compaction on (the model's window known), the opening reads the history and
    what waits, to weigh the next request, inside its fenced transaction. On a pool of one
    connection (PostgreSQL) a read that asked the pool for a second one while the first holds
    the claim row would wait out the checkout bound and fail; here the opening succeeds."""
    store = await target.open(db_pool_size=1, db_pool_overflow=0, lease_ms=3000)
    try:
        script = tmp_path / "model.json"
        limits = {"context": 100_000, "output": 1_000}
        script.write_text(json.dumps({"limits": limits, "turns": [{"events": [{"text": "hi"}]}]}))
        model = ModelRef.parse(f"scripted/{script}")
        sid = (await store.sessions.create(str(tmp_path), model=model)).id
        claim = await store.claims.acquire(sid, "exec_a", "owner")
        await store.inputs.admit(sid, "weigh me", delivery="steer")
        begun = await _begin(store, claim)
        assert (begun.step, begun.index) == (1, 0)
    finally:
        await store.close()
