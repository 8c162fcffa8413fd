"""Catalogue C11: a database that refuses writes."""

from __future__ import annotations

import pytest

from sessionflow.errors import StoreUnavailableError
from store.events import StoredEvent
from tests.conftest import Target
from tests.store.helpers import Probe

READ_ONLY = "options=-c%20default_transaction_read_only%3Don"


async def test_a_read_only_database_refuses_a_batch_whole_and_loudly(
    postgres_target: Target,
) -> None:
    """C11: the store's connections become read-only (``default_transaction_read_only``, as
    ``ALTER DATABASE … SET`` makes them, set here per connection so no other test is touched).
    A batch appended under a live claim fails with the typed ``StoreUnavailableError`` naming
    the cause, nothing of it is committed, and the same batch goes in whole once writes are
    allowed again: the seq stays gap-free."""
    writable = await postgres_target.open()
    read_only = await Target(f"{postgres_target.url}?{READ_ONLY}", postgres_target.schema).open()
    for opened in (writable, read_only):
        opened.events.registry.register(Probe)
    try:
        session = await writable.sessions.create("/tmp")
        claim = await writable.claims.acquire(session.id, "exec_ro", "owner_ro")
        before = await writable.events.latest_sequence(session.id)
        batch = [Probe(session_id=session.id, value=value) for value in range(3)]
        with pytest.raises(StoreUnavailableError, match="read-only"):
            await read_only.append(claim, batch)
        assert await writable.events.latest_sequence(session.id) == before
        stored = await writable.append(claim, batch)
        log = [e async for e in writable.events.log(session.id) if isinstance(e, StoredEvent)]
    finally:
        await read_only.close()
        await writable.close()
    assert [e.seq for e in stored] == [before + 1, before + 2, before + 3]
    assert [e.seq for e in log] == list(range(before + 4))


async def test_a_store_that_must_migrate_on_a_read_only_database_says_so(
    postgres_target: Target,
) -> None:
    """C11: a store that does not exist yet cannot be created on a read-only database: opening
    it is one typed error naming the cause, not a driver traceback."""
    url = f"{postgres_target.url}?{READ_ONLY}"
    refused = "store cannot be opened: the database is read-only"
    with pytest.raises(StoreUnavailableError, match=refused):
        await Target(url, postgres_target.schema).open()
