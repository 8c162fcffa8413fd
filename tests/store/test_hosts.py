"""Host leases and a session's placement (``store/hosts.py``, ``Sessions.move``)."""

from __future__ import annotations

import pytest

from sessionflow.errors import InvalidHostError, SessionBusyError
from sessionflow.models import events as ev
from store import Store
from tests.store.helpers import rows


async def test_a_renewed_lease_is_live_and_a_withdrawn_one_gone_at_once(store: Store) -> None:
    assert (await store.hosts.state("ci-3")).ever is False
    tools = [{"name": "bash", "description": "run", "input_schema": {}, "retry_safe": False}]
    await store.hosts.renew("ci-3", "box/1", task_queue="q@ci-3", version="1", tools=tools)
    await store.hosts.renew("ci-3", "box/1", task_queue="q@ci-3", version="1")  # a renewal
    state = await store.hosts.state("ci-3")
    assert (state.status, state.ever, state.workers) == ("live", True, 1)
    (worker,) = await store.hosts.workers()
    assert (worker.host, worker.worker, worker.tools) == ("ci-3", "box/1", ("bash",))
    assert await store.hosts.offered("ci-3") == tools  # a renewal keeps what it offers
    await store.hosts.withdraw("ci-3", "box/1")
    state = await store.hosts.state("ci-3")
    assert (state.status, state.ever, state.workers) == ("gone", True, 0)
    assert await store.hosts.offered("ci-3") == tools  # its calls then say the host is gone
    assert await store.hosts.offered("ci-4") is None


async def test_a_host_is_live_while_any_of_its_workers_is(store: Store) -> None:
    for worker in ("a/1", "a/2"):
        await store.hosts.renew("a", worker, task_queue="q@a", version="1", tools=[])
    await store.hosts.withdraw("a", "a/1")
    assert (await store.hosts.state("a")).workers == 1
    assert (await store.hosts.state("a")).live


def test_a_lease_not_seen_for_two_renewals_is_late_then_gone(store: Store) -> None:
    lease = store.hosts.lease_ms
    assert store.hosts.status(0) == "live"
    assert store.hosts.status(lease - 1) == "late"
    assert store.hosts.status(lease) == "gone"


async def test_a_bad_host_name_is_refused(store: Store) -> None:
    with pytest.raises(InvalidHostError, match="Invalid host name"):
        await store.hosts.renew("no/slash", "w", task_queue="q", version="1")


@pytest.mark.breaks_invariants("I4")  # the baseline is published unclaimed
async def test_a_session_moves_between_busy_periods_only(store: Store) -> None:
    info = await store.sessions.create("/work/a", host="a")
    assert info.host == "a"
    await store.events.publish(
        ev.ContextBaselined(session_id=info.id, baseline="x", snapshot={"AGENTS.md": "x"})
    )
    claim = await store.claims.acquire(info.id, "exec_1", "owner-1")
    with pytest.raises(SessionBusyError, match="between busy periods"):
        await store.sessions.move(info.id, "b", "/work/b")
    assert (await store.sessions.get(info.id)).host == "a"
    await store.claims.release(claim)
    moved = await store.sessions.move(info.id, "b", "/work/b", observed={"AGENTS.md": "new"})
    assert (moved.host, moved.directory) == ("b", "/work/b")
    # The baseline is rebuilt after the move (reference §7.2 #5) from the new host's view.
    assert moved.settings["baseline"] is None
    assert moved.settings["observed"] == {"AGENTS.md": "new"}
    latest = await store.events.latest_of(info.id, ev.SessionMoved)
    assert latest is not None and isinstance(latest.data, ev.SessionMoved)
    assert (latest.data.previous_host, latest.data.previous_directory) == ("a", "/work/a")
    assert await rows(store, "SELECT host FROM session WHERE id = :sid", sid=info.id) == [("b",)]


async def test_a_session_without_a_host_is_on_the_local_host(store: Store) -> None:
    info = await store.sessions.create("/work/a")
    assert info.host == "local"
    assert await rows(store, "SELECT host FROM session WHERE id = :sid", sid=info.id) == [(None,)]
