"""Concurrency across connections and processes: claim races, gap-free appends, followers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from sessionflow.errors import StoreUnavailableError
from store import Store
from store.events import StoredEvent
from tests.conftest import StoreFactory, Target
from tests.pgcluster import Cluster
from tests.store.helpers import Probe, appends_with_rollbacks, rows
from tests.store.procs import appender, claim_racer, spawn
from tests.store.procs import context as procs_context

APPENDERS = 4
APPENDS = 10_000  # attempted, across the appenders; about 30 % of them aborted


@pytest.mark.parametrize(
    ("workers", "rounds"),
    [(2, 500), (4, 500), pytest.param(16, 50, marks=pytest.mark.fault)],
)
async def test_claim_race_has_exactly_one_winner_per_round(
    store: Store, target: Target, workers: int, rounds: int
) -> None:
    """Catalogue F1: the claim race. ``workers`` spawned processes claim each of ``rounds``
    idle sessions at the same instant (a barrier per round); the winner appends one event, and
    every loser tries to append as if it had won. One winner per round, at epoch 1; every loser
    gets the typed ``ClaimHeldError`` naming the winner and its write is refused; each session
    holds one claim, the winner's, and one event stamped with it; no recovery rows."""
    sessions = [(await store.sessions.create("/race")).id for _ in range(rounds)]
    context = procs_context()
    barrier, results = context.Barrier(workers), context.Queue()
    processes = [
        spawn(claim_racer, target, worker, sessions, barrier, results) for worker in range(workers)
    ]
    outcomes = [await asyncio.to_thread(results.get, True, 120) for _ in range(workers * rounds)]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    claims = {
        row[0]: (row[1], row[2])
        for row in await rows(store, "SELECT session_id, id, epoch FROM session_execution")
    }
    stamps = await rows(
        store, "SELECT aggregate_id, execution_id FROM event WHERE execution_id IS NOT NULL"
    )
    written = {sid: [e for s, e in stamps if s == sid] for sid in sessions}
    for round_, session_id in enumerate(sessions):
        round_outcomes = [o for o in outcomes if o[0] == round_]
        winners = [o for o in round_outcomes if o[2] == "won"]
        assert len(winners) == 1, f"round {round_}: {round_outcomes}"
        (_, worker, _, epoch, _) = winners[0]
        winner = f"exec_{round_}_{worker}"
        assert epoch == 1
        losers = [o for o in round_outcomes if o[2] == "held"]
        assert {o[3] for o in losers} == {winner} and len(losers) == workers - 1
        assert all(o[4] for o in losers), f"round {round_}: a loser's write went in"
        assert claims[session_id] == (winner, 1)
        assert written[session_id] == [winner]  # losers wrote 0 events
    assert len(claims) == rounds
    assert await rows(store, "SELECT count(*) FROM session_recovery") == [(0,)]


@pytest.mark.fault  # up to about 25 s on each database here, under load
async def test_concurrent_appenders_with_aborted_transactions_stay_gap_free(
    open_test_store: StoreFactory,
) -> None:
    """Catalogue S3: gapless seq under rollbacks. 10^4 appends to one aggregate from four
    stores (four connections) at once, about 30 % of the transactions aborted after their
    insert: the committed seqs are exactly 0 .. committed - 1."""
    stores = [await open_test_store() for _ in range(APPENDERS)]
    for store in stores:
        store.events.registry.register(Probe)
    committed = await appends_with_rollbacks(stores, APPENDS)
    assert 0.6 * APPENDS < committed < 0.8 * APPENDS


async def _follow_until(
    store: Store, aggregate: str, last: int, into: list[int] | None = None, **kwargs: object
) -> list[int]:
    received: list[int] = [] if into is None else into
    async for item in store.events.log(aggregate, follow=True, **kwargs):  # type: ignore[arg-type]
        if isinstance(item, StoredEvent):
            received.append(item.seq)
            if item.seq == last:
                break
    return received


async def test_a_follower_started_during_heavy_appends_from_another_process_misses_nothing(
    store: Store, target: Target
) -> None:
    """Catalogue S5: the history-then-live handoff."""
    store.events.registry.register(Probe)
    total = 400
    process = spawn(appender, target, "ses_heavy", total, 0)
    while await store.events.latest_sequence("ses_heavy") < 50:
        await asyncio.sleep(0.01)
    # A long poll interval: on PostgreSQL the NOTIFY doorbell must carry the live phase.
    interval = 30.0 if target.backend == "postgresql" else 0.05
    received = await asyncio.wait_for(
        _follow_until(store, "ses_heavy", total - 1, poll_interval=interval), 60
    )
    await asyncio.to_thread(process.join, 30)
    assert process.exitcode == 0
    assert received == list(range(total))


async def test_a_postgres_follower_survives_its_listener_connection_being_killed(
    postgres_target: Target,
) -> None:
    """Catalogue C4, S6: PostgreSQL restart mid-drain; the listener connection killed."""
    target = postgres_target
    store = await target.open()
    store.events.registry.register(Probe)
    total = 300
    follower = asyncio.create_task(
        _follow_until(store, "ses_killed", total - 1, poll_interval=60.0)
    )
    while store.notifier.listener_pid is None:
        await asyncio.sleep(0.01)
    first_pid = store.notifier.listener_pid
    process = spawn(appender, target, "ses_killed", total, 20)
    while await store.events.latest_sequence("ses_killed") < 100:
        await asyncio.sleep(0.01)
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql(f"SELECT pg_terminate_backend({first_pid})")
    received = await asyncio.wait_for(follower, 60)
    await asyncio.to_thread(process.join, 30)
    await store.close()
    assert received == list(range(total))
    assert store.notifier.reconnects >= 1 and store.notifier.listener_pid != first_pid


@pytest.mark.parametrize("how", ["restart -m fast", "stop -m immediate"])
async def test_a_postgres_follower_rides_out_its_server_going_down(
    how: str, pg_cluster: Cluster, cluster_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Catalogue C4: a follower past its history while its whole PostgreSQL server (a throwaway
    cluster) restarts, or stops and, once the follower's read has found it down, starts again.
    It keeps its cursor and gets every event once, those appended after the restart too (it
    used to end with ``StoreUnavailableError``)."""
    caplog.set_level(logging.WARNING, logger="store.events")
    store = await Target(cluster_database).open()
    store.events.registry.register(Probe)
    try:
        await store.events.publish(Probe(session_id="ses_restart", value=0))
        seen: list[int] = []
        follow = _follow_until(store, "ses_restart", 2, seen, poll_interval=0.02)
        follower = asyncio.create_task(follow)
        await store.events.publish(Probe(session_id="ses_restart", value=1))
        while 1 not in seen:  # past its history: what remains of it reads nothing
            await asyncio.sleep(0.01)
        if how == "restart -m fast":
            await asyncio.to_thread(pg_cluster.restart_fast)
        else:
            await asyncio.to_thread(pg_cluster.stop_immediate)
            while not follower.done() and not _retried(caplog):
                await asyncio.sleep(0.01)
            await asyncio.to_thread(pg_cluster.start)
        await _through_outage(
            lambda: store.events.publish(Probe(session_id="ses_restart", value=2))
        )
        received = await asyncio.wait_for(follower, 30)
    finally:
        await store.close()
    assert received == [0, 1, 2]


def _retried(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether the follower's read found the database down and is trying again."""
    return any(r.getMessage().startswith("Following:") for r in caplog.records)


async def _through_outage(write: Callable[[], Awaitable[object]]) -> None:
    """A write its caller retries while the database is still coming back."""
    while True:
        try:
            await write()
            return
        except StoreUnavailableError:
            await asyncio.sleep(0.05)
