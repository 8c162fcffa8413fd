"""``through_outages``: the retry that lets a tool's result outlast a database outage (C4)."""

from __future__ import annotations

import pytest

from activities.runtime import through_outages
from sessionflow.errors import StoreUnavailableError


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
