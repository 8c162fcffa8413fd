"""``Store.settle_call``: a tool call's settlement in one statement on PostgreSQL.

The fence (with the call's attempt), the part's new state and the event commit together, and
only while the part is still what the caller read; anything else writes nothing and hands the
settlement back to the general path (None).
"""

from __future__ import annotations

import pytest

from sessionflow.models import events as ev
from sessionflow.models.common import TextContent
from sessionflow.models.messages import ToolCompleted, ToolError
from store import Store
from store.claims import Claim
from store.events import StoredEvent
from store.sessions import StoredPart
from store.tool_runs import ToolAttempt
from tests.store.test_projector import new_session, start_step


async def called(store: Store) -> tuple[Claim, ToolAttempt, StoredPart]:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    call = ev.ToolCalled(session_id=sid, assistant_message_id=mid, call_id="c", name="t", input={})
    await store.append(claim, [call])
    _, stored = await store.sessions.tool_call(sid, mid, "c")
    assert stored is not None
    return claim, ToolAttempt(sid, claim.execution_id, mid, "c", 1), stored


def succeeded(run: ToolAttempt, text: str = "out") -> ev.ToolSucceeded:
    return ev.ToolSucceeded(
        session_id=run.session_id,
        assistant_message_id=run.assistant_message_id,
        call_id=run.call_id,
        content=[TextContent(text=text)],
        result=text,
    )


async def seqs(store: Store, sid: str) -> list[int]:
    return [e.seq for e in (await store.events.read_after(sid)).events]


@pytest.mark.breaks_invariants("I4")  # its step starts unclaimed (test_projector.start_step)
@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_settlement_commits_the_event_and_the_part_together(store: Store) -> None:
    claim, run, before = await called(store)
    heard: list[StoredEvent] = []
    store.events.listen(heard.append)
    settled = await store.settle_call(claim, run, succeeded(run), before)
    if store.db.dialect == "sqlite":
        assert settled is None  # SQLite's general path is already inline
        return
    assert settled is not None and settled.type == "session.tool.success.1"
    assert heard == [settled]  # announced like any append
    log = await seqs(store, claim.session_id)
    assert log == list(range(len(log))) and log[-1] == settled.seq
    part = await store.sessions.tool_part(claim.session_id, run.assistant_message_id, "c")
    assert part is not None and isinstance(part.state, ToolCompleted)
    assert part.state.content == [TextContent(text="out")]
    assert part.time.completed == settled.created


@pytest.mark.breaks_invariants("I4")  # its step starts unclaimed (test_projector.start_step)
@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_part_that_changed_since_it_was_read_is_left_to_the_general_path(
    store: Store,
) -> None:
    claim, run, before = await called(store)
    failed = ev.ToolFailed(
        session_id=run.session_id,
        assistant_message_id=run.assistant_message_id,
        call_id="c",
        error={"type": "tool.execution", "message": "settled elsewhere"},
    )
    await store.append(claim, [failed])  # an interrupt settled it meanwhile
    log = await seqs(store, claim.session_id)
    assert await store.settle_call(claim, run, succeeded(run), before) is None
    assert await seqs(store, claim.session_id) == log
    part = await store.sessions.tool_part(claim.session_id, run.assistant_message_id, "c")
    assert part is not None and isinstance(part.state, ToolError)


# Its step starts unclaimed (test_projector.start_step); released, it leaves that step and its
# call open.
@pytest.mark.breaks_invariants("I4", "I5", "I6")
async def test_a_fenced_out_settlement_writes_nothing(store: Store) -> None:
    """A later attempt took the call, or the claim is gone: nothing written, not even a seq."""
    claim, run, before = await called(store)
    sid, mid = run.session_id, run.assistant_message_id
    async with store.claims.fenced(claim) as tx:
        await store.tool_runs.take(tx, ToolAttempt(sid, run.execution_id, mid, "c", 2))
    log = await seqs(store, claim.session_id)
    assert await store.settle_call(claim, run, succeeded(run), before) is None
    later = ToolAttempt(sid, run.execution_id, mid, "c", 2)
    await store.claims.release(claim)
    assert await store.settle_call(claim, later, succeeded(later), before) is None
    assert await seqs(store, claim.session_id) == log
    part = await store.sessions.tool_part(claim.session_id, run.assistant_message_id, "c")
    assert part == before.part


@pytest.mark.breaks_invariants("I4")  # its step starts unclaimed (test_projector.start_step)
@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_held_calls_settlement_puts_the_claim_back_on_its_lease_once_no_call_waits(
    store: Store,
) -> None:
    """A call that waited on its child held the claim past its lease; its settlement with
    ``lease_after`` (one fenced write) ends the hold only when no other call of the step
    still waits on a child, and the last one's does."""
    from store.write.decide import Decision
    from tests.store.helpers import rows

    claim, run, _ = await called(store)
    sid, mid = claim.session_id, run.assistant_message_id
    other = ev.ToolCalled(session_id=sid, assistant_message_id=mid, call_id="d", name="t", input={})
    await store.append(claim, [other])
    for call_id in ("c", "d"):  # both wait on a child, holding the claim for an hour
        linked = ev.ToolProgress(
            session_id=sid, assistant_message_id=mid, call_id=call_id, structured={"child": {}}
        )
        await store.append(claim, [linked])
    hold = claim.expires_at + 3_600_000
    await store.claims.run_fenced(claim, lambda tx: store.claims.extend_until(tx, claim, hold))

    async def settle(attempt: ToolAttempt) -> int:
        def decide(_part: object) -> Decision[None]:
            return Decision(None, [succeeded(attempt)], lease_after=mid)

        await store.settle_with(claim, attempt, None, decide)
        ((expires,),) = await rows(store, "SELECT expires_at FROM session_execution")
        return int(expires)

    assert await settle(run) == hold  # "d" still waits on its child
    back = await settle(ToolAttempt(sid, claim.execution_id, mid, "d", 1))
    assert back < hold and back <= claim.expires_at + 60_000  # a lease from now, not an hour
