"""Sessions: lookup and listing (reference §1.3, §8.6)."""

from __future__ import annotations

import pytest

from sessionflow.errors import InvalidDurableEventError, InvalidIdError, SessionNotFoundError
from sessionflow.ids import session_id
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef, Tokens
from store import Store
from store.sessions import DEFAULT_LIST_LIMIT
from tests.store.helpers import count


async def make(
    store: Store,
    created: int,
    *,
    sid: str | None = None,
    title: str = "",
    directory: str = "/work",
    workspace_id: str | None = None,
    parent_id: str | None = None,
) -> str:
    """A session whose ``time_created`` and ``time_updated`` are ``created``."""
    sid = sid or session_id()
    event = ev.SessionCreated(
        session_id=sid,
        directory=directory,
        title=title,
        workspace_id=workspace_id,
        parent_id=parent_id,
    )
    await store.events.publish(event, created=created)
    return sid


async def listed(store: Store, **filters: object) -> list[str]:
    return [info.id for info in await store.sessions.list(**filters)]  # type: ignore[arg-type]


# --- get ----------------------------------------------------------------------------------------


async def test_get_returns_the_created_session(store: Store) -> None:
    model = ModelRef(provider_id="scripted", id="demo.json")
    info = await store.sessions.create(
        "/repo",
        session_id="ses_get",
        title="Title",
        model="scripted/demo.json",
        agent="build",
        workspace_id="wrk_1",
        parent_id="ses_parent",
        settings={"max_steps": 3},
    )
    got = await store.sessions.get("ses_get")
    assert got == info
    assert (got.id, got.directory, got.title, got.model, got.agent) == (
        "ses_get",
        "/repo",
        "Title",
        model,
        "build",
    )
    assert (got.workspace_id, got.parent_id, got.settings) == (
        "wrk_1",
        "ses_parent",
        {"max_steps": 3},
    )
    assert (got.cost, got.tokens) == (0.0, Tokens())
    assert got.time_created == got.time_updated > 0


async def test_get_of_an_unknown_session_raises(store: Store) -> None:
    with pytest.raises(SessionNotFoundError) as raised:
        await store.sessions.get("ses_unknown")
    assert raised.value.session_id == "ses_unknown"


async def test_get_with_an_invalid_id_raises(store: Store) -> None:
    with pytest.raises(InvalidIdError):
        await store.sessions.get("ses unknown; --")


async def test_creating_a_session_twice_is_refused(store: Store) -> None:
    await store.sessions.create("/work", session_id="ses_twice", title="first")
    with pytest.raises(InvalidDurableEventError, match="already exists"):
        await store.sessions.create("/elsewhere", session_id="ses_twice", title="second")
    assert await store.events.latest_sequence("ses_twice") == 0
    info = await store.sessions.get("ses_twice")
    assert (info.title, info.directory) == ("first", "/work")


# --- list ---------------------------------------------------------------------------------------


async def test_list_is_newest_update_first(store: Store) -> None:
    old = await make(store, 1_000)
    new = await make(store, 3_000)
    middle = await make(store, 2_000)
    assert await listed(store) == [new, middle, old]
    assert [info.time_updated for info in await store.sessions.list()] == [3_000, 2_000, 1_000]


async def test_list_breaks_time_ties_by_id_newest_first(store: Store) -> None:
    await make(store, 1_000, sid="ses_a")
    await make(store, 1_000, sid="ses_c")
    await make(store, 1_000, sid="ses_b")
    assert await listed(store) == ["ses_c", "ses_b", "ses_a"]


@pytest.mark.breaks_invariants("I4")  # the rename is published unclaimed
async def test_an_update_moves_a_session_to_the_top(store: Store) -> None:
    first = await make(store, 1_000)
    second = await make(store, 2_000)
    await store.events.publish(ev.SessionRenamed(session_id=first, title="renamed"), created=5_000)
    assert await listed(store) == [first, second]
    assert (await store.sessions.get(first)).time_updated == 5_000


async def test_an_admission_moves_the_session_to_the_top(store: Store) -> None:
    older = await make(store, 1_000)
    newer = await make(store, 2_000)
    assert await listed(store) == [newer, older]
    receipt = await store.inputs.admit(older, "hello")
    assert await listed(store) == [older, newer]
    info = await store.sessions.get(older)
    assert info.time_updated == receipt.time_created > 2_000
    assert info.time_created == 1_000


async def test_list_filters_by_exact_directory(store: Store) -> None:
    here = await make(store, 1_000, directory="/work")
    await make(store, 2_000, directory="/work/sub")
    await make(store, 3_000, directory="/other")
    also_here = await make(store, 4_000, directory="/work")
    assert await listed(store, directory="/work") == [also_here, here]
    assert await listed(store, directory="/wor") == []


async def test_list_filters_by_workspace(store: Store) -> None:
    one = await make(store, 1_000, workspace_id="wrk_1")
    await make(store, 2_000, workspace_id="wrk_2")
    await make(store, 3_000)
    assert await listed(store, workspace_id="wrk_1") == [one]
    assert await listed(store, workspace_id="wrk_3") == []


async def test_list_roots_only_hides_child_sessions(store: Store) -> None:
    root = await make(store, 1_000)
    child = await make(store, 2_000, parent_id=root)
    other_root = await make(store, 3_000)
    assert await listed(store) == [other_root, child, root]
    assert await listed(store, roots_only=True) == [other_root, root]


async def test_list_updated_since_is_inclusive(store: Store) -> None:
    await make(store, 1_000)
    at = await make(store, 2_000)
    after = await make(store, 3_000)
    assert await listed(store, updated_since=2_000) == [after, at]
    assert await listed(store, updated_since=2_001) == [after]
    assert await listed(store, updated_since=3_001) == []


async def test_list_search_matches_a_title_substring(store: Store) -> None:
    fix = await make(store, 1_000, title="Fix the login bug")
    page = await make(store, 2_000, title="login page")
    await make(store, 3_000, title="Other work")
    assert await listed(store, search="login") == [page, fix]
    assert await listed(store, search="the login b") == [fix]
    assert await listed(store, search="logout") == []
    assert len(await listed(store, search="")) == 3


@pytest.mark.parametrize(
    ("search", "matching", "other"),
    [
        ("100%", "100% done", "1000 done"),
        ("%", "50% off", "no percent"),
        ("a_b", "a_b", "axb"),
        ("_", "snake_case", "camelCase"),
        ("a/b", "a/b", "ab"),
        ("\\", "back\\slash", "backslash"),
    ],
)
async def test_list_search_wildcards_are_literal(
    store: Store, search: str, matching: str, other: str
) -> None:
    hit = await make(store, 1_000, title=matching)
    await make(store, 2_000, title=other)
    assert await listed(store, search=search) == [hit]


async def test_list_filters_combine(store: Store) -> None:
    root = await make(store, 1_000, title="deploy", directory="/a", workspace_id="wrk_1")
    await make(store, 2_000, title="deploy", directory="/a", workspace_id="wrk_1", parent_id=root)
    await make(store, 3_000, title="deploy", directory="/b", workspace_id="wrk_1")
    await make(store, 4_000, title="build", directory="/a", workspace_id="wrk_1")
    await make(store, 5_000, title="deploy", directory="/a", workspace_id="wrk_2")
    found = await listed(
        store,
        directory="/a",
        workspace_id="wrk_1",
        search="dep",
        roots_only=True,
        updated_since=500,
    )
    assert found == [root]


async def test_list_returns_at_most_100_newest_by_default(store: Store) -> None:
    assert DEFAULT_LIST_LIMIT == 100
    old = [await make(store, 1_000 + i) for i in range(5)]
    recent = [
        ev.SessionCreated(session_id=f"ses_bulk_{i:03d}", directory="/bulk") for i in range(100)
    ]
    await store.events.publish_many(recent)
    assert await count(store, "session") == 105

    default = await listed(store)
    assert len(default) == 100
    assert set(default) == {f"ses_bulk_{i:03d}" for i in range(100)}
    assert not set(old) & set(default)

    everything = await listed(store, limit=1_000)
    assert len(everything) == 105
    assert everything[:100] == default
    assert everything[100:] == old[::-1]


async def test_list_honours_an_explicit_limit(store: Store) -> None:
    ids = [await make(store, 1_000 + i) for i in range(5)]
    assert await listed(store, limit=2) == [ids[4], ids[3]]
    assert await listed(store, limit=5) == ids[::-1]
    assert await listed(store, limit=50) == ids[::-1]
    assert await listed(store, directory="/work", limit=1) == [ids[4]]


async def test_list_search_ignores_case_on_both_databases(store: Store) -> None:
    hit = (await store.sessions.create("/w", title="Fix Login Bug")).id
    await store.sessions.create("/w", title="other")
    assert [s.id for s in await store.sessions.list(search="login")] == [hit]
    assert [s.id for s in await store.sessions.list(search="LOGIN")] == [hit]


async def test_list_refuses_a_limit_below_one(store: Store) -> None:
    with pytest.raises(ValueError, match="limit must be at least 1"):
        await store.sessions.list(limit=0)
