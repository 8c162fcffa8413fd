"""``through_outages``: the retry that lets a tool's result outlast a database outage (C4);
``heartbeating``: heartbeats that never wait for a claim renewal."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from temporalio.testing import ActivityEnvironment

from activities.runtime import application_error, heartbeating, through_outages
from sessionflow.errors import ClaimHeldError, StoreUnavailableError
from sessionflow.models.drain import ClaimRef


async def test_a_write_refused_while_the_database_is_down_goes_in_once_it_is_back() -> None:
    """C4: refused twice (the database down), the third try's result is returned."""
    tries: list[int] = []

    async def write() -> str:
        tries.append(len(tries))
        if len(tries) < 3:
            raise StoreUnavailableError("the connection failed (down)")
        return "stored"

    assert await through_outages(write, within_ms=10_000) == "stored"
    assert len(tries) == 3


async def test_an_outage_longer_than_the_bound_is_raised_and_other_errors_at_once() -> None:
    """C4: past ``within_ms`` the outage is the caller's; any other error is never retried."""
    tries: list[str] = []

    async def down() -> None:
        tries.append("down")
        raise StoreUnavailableError("the connection failed (down)")

    with pytest.raises(StoreUnavailableError):
        await through_outages(down, within_ms=1000)
    assert len(tries) >= 2  # retried before giving up

    async def broken() -> None:
        tries.append("broken")
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        await through_outages(broken, within_ms=10_000)
    assert tries.count("broken") == 1


class _StuckClaims:
    """A store whose claim renewal waits until released (a busy pool, a locked claim row)."""

    def __init__(self) -> None:
        self.renewing = asyncio.Event()
        self.release = asyncio.Event()

    async def renew(self, _claim: object) -> None:
        self.renewing.set()
        await self.release.wait()


async def test_heartbeats_go_on_while_a_claim_renewal_is_stuck() -> None:
    """A renewal stuck behind the database must not stop the heartbeats: the activity would
    time out (and its call run again) while its claim is in fact fine."""
    claims = _StuckClaims()
    store = SimpleNamespace(claims=claims)
    claim = ClaimRef(session_id="ses_a", execution_id="x", owner_id="o", epoch=1, lease_ms=300)
    beats: list[object] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details)
    enough = asyncio.Event()

    async def work() -> int:
        async with heartbeating(store, claim):  # type: ignore[arg-type]
            await claims.renewing.wait()
            seen = len(beats)
            while len(beats) < seen + 3:  # three more beats while the renewal waits
                await asyncio.sleep(0.05)
            enough.set()
            claims.release.set()
            return len(beats)

    assert await asyncio.wait_for(env.run(work), 60) >= 4
    assert enough.is_set()


def test_a_held_claims_retry_waits_by_the_database_clock_not_the_workers() -> None:
    """Catalogue F7: a worker whose clock is an hour off still retries a held claim when the
    database says it expires (the store read its clock when it saw the claim held)."""
    held = ClaimHeldError("ses_x", "exec_a", expires_at_ms=10_000, now_ms=7_500)
    assert held.remaining_ms() == 2_500  # whatever time.time() says here
    delay = application_error(held).next_retry_delay
    assert delay is not None and delay.total_seconds() == pytest.approx(2.6)


def test_a_held_claim_seen_without_the_database_clock_falls_back_to_this_process() -> None:
    held = ClaimHeldError("ses_x", "exec_a", expires_at_ms=0)
    assert held.remaining_ms() == 0
