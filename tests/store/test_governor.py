"""The rate governor (``store/governor.py``) on both databases: limits, rate-limit answers,
order of arrival, and racing takers that never exceed a limit."""

from __future__ import annotations

import asyncio

import pytest

from store import Store
from store.governor import WINDOW_MS, Governor, Grant, RateLimits, Wait

KEY = "openai:abc123"


async def test_stream_slots_are_limited_and_given_back(store: Store) -> None:
    g = store.governor
    limits = RateLimits(streams=2)
    a = await g.take(KEY, "ses_a", 10, limits)
    b = await g.take(KEY, "ses_b", 10, limits)
    assert isinstance(a, Grant) and isinstance(b, Grant)
    c = await g.take(KEY, "ses_c", 10, limits)
    assert isinstance(c, Wait) and c.reason == "2 concurrent streams"
    await g.give_back(a, used=10)
    assert isinstance(await g.take(KEY, "ses_c", 10, limits), Grant)
    assert (await g.state(KEY))["streams"] == 2


async def test_a_holder_takes_one_slot_however_often_it_asks(store: Store) -> None:
    g = store.governor
    limits = RateLimits(streams=1)
    assert isinstance(await g.take(KEY, "ses_a", 1, limits), Grant)
    # The same session again (its turn re-ran after its worker died) replaces its slot.
    assert isinstance(await g.take(KEY, "ses_a", 1, limits), Grant)
    assert (await g.state(KEY))["streams"] == 1


async def test_an_earlier_requests_give_back_leaves_the_re_runs_slot(store: Store) -> None:
    g = store.governor
    limits = RateLimits(streams=1, tpm=10_000)
    old = await g.take(KEY, "ses_a", 1000, limits)
    await asyncio.sleep(0.002)  # the re-run's slot ends later: that tells the two apart
    rerun = await g.take(KEY, "ses_a", 1000, limits)
    assert isinstance(old, Grant) and isinstance(rerun, Grant)
    assert rerun.expires_at != old.expires_at
    await g.give_back(old, used=100)  # the lost attempt's give-back arrives late
    state = await g.state(KEY)
    assert (state["streams"], state["tokens"]) == (1, 2000)
    assert isinstance(await g.take(KEY, "ses_b", 1, limits), Wait)
    await g.give_back(rerun, used=400)
    await g.give_back(rerun, used=400)  # given back twice (a retried activity): counted once
    state = await g.state(KEY)
    assert (state["streams"], state["tokens"]) == (0, 1400)


async def test_requests_per_minute_wait_for_the_next_minute(store: Store) -> None:
    g = store.governor
    limits = RateLimits(rpm=3)
    grants = [await g.take(KEY, f"ses_{i}", 1, limits) for i in range(3)]
    assert all(isinstance(grant, Grant) for grant in grants)
    for grant in grants:
        assert isinstance(grant, Grant)
        await g.give_back(grant)
    wait = await g.take(KEY, "ses_9", 1, limits)
    assert isinstance(wait, Wait) and wait.reason == "3 requests per minute"
    first = grants[0]
    assert isinstance(first, Grant) and wait.until_ms == first.window_start + WINDOW_MS


async def test_tokens_per_minute_count_what_was_used_not_what_was_guessed(store: Store) -> None:
    g = store.governor
    limits = RateLimits(tpm=1000)
    first = await g.take(KEY, "ses_a", 800, limits)
    assert isinstance(first, Grant)
    refused = await g.take(KEY, "ses_b", 300, limits)
    assert isinstance(refused, Wait) and refused.reason == "1000 tokens per minute"
    await g.give_back(first, used=500)  # it used less than it took: the rest is free again
    assert (await g.state(KEY))["tokens"] == 500
    assert isinstance(await g.take(KEY, "ses_b", 300, limits), Grant)


async def test_a_rate_limit_answer_closes_the_key_for_everyone(store: Store) -> None:
    g = store.governor
    until = await g.close(KEY, 3000)
    assert until == await g.close(KEY, 100)  # a later, shorter answer never shortens it
    for holder in ("ses_a", "ses_b"):
        wait = await g.take(KEY, holder, 1, RateLimits())
        assert isinstance(wait, Wait) and wait.until_ms == until
        assert wait.reason == "the provider answered rate-limited"


async def test_waiters_are_served_in_order_of_arrival(store: Store) -> None:
    g = store.governor
    limits = RateLimits(streams=1)
    held = await g.take(KEY, "ses_holder", 1, limits)
    assert isinstance(held, Grant)
    assert isinstance(await g.take(KEY, "ses_first", 1, limits), Wait)
    await asyncio.sleep(0.01)  # a later arrival by the database clock
    assert isinstance(await g.take(KEY, "ses_second", 1, limits), Wait)
    await g.give_back(held)
    # The slot is free, but the later arrival asks first: it waits for the earlier one.
    ahead = await g.take(KEY, "ses_second", 1, limits)
    assert isinstance(ahead, Wait) and ahead.reason == "1 session(s) ahead"
    served = await g.take(KEY, "ses_first", 1, limits)
    assert isinstance(served, Grant)
    await g.give_back(served)
    assert isinstance(await g.take(KEY, "ses_second", 1, limits), Grant)


async def test_a_waiter_that_gave_up_blocks_nobody_for_long(store: Store) -> None:
    g = Governor(store.db, waiter_ms=50)
    limits = RateLimits(streams=1)
    held = await g.take(KEY, "ses_holder", 1, limits)
    assert isinstance(held, Grant)
    assert isinstance(await g.take(KEY, "ses_gone", 1, limits), Wait)  # then interrupted
    await g.give_back(held)
    await asyncio.sleep(0.1)
    assert isinstance(await g.take(KEY, "ses_later", 1, limits), Grant)


@pytest.mark.parametrize("limit", [1, 3])
async def test_racing_takers_never_exceed_the_limit(store: Store, limit: int) -> None:
    limits = RateLimits(streams=limit)
    taken = await asyncio.gather(
        *(store.governor.take(KEY, f"ses_{i}", 1, limits) for i in range(20))
    )
    assert sum(isinstance(t, Grant) for t in taken) == limit
    assert (await store.governor.state(KEY))["streams"] == limit
