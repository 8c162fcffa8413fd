"""Hostile text and ids: stored losslessly with one normalization, or refused before writing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionflow.errors import InvalidIdError, PayloadTooLargeError
from sessionflow.models import events as ev
from sessionflow.models.common import ModelRef
from sessionflow.models.messages import AssistantMessage
from store import Store, codec
from tests.store.helpers import count, rows

INVALID_UTF8 = b"ok \xff\xfe \xc3\x28 end".decode("utf-8", "surrogateescape")
HOSTILE = (
    "nul\x00byte",
    "lone \ud800 high and \udfff low",
    INVALID_UTF8,
    "ansi \x1b[31mred\x1b[0m osc \x1b]0;title\x07",
    "rtl \u202e override, zero\u200bwidth",
    "emoji 👩‍💻 combining e\u0301",
    'quote " backslash \\ newline \n tab \t',
)

BAD_IDS = (
    "'; DROP TABLE event; --",
    'x"; LISTEN y',
    "a" * 129,
    "b" * 10_000,
    "",
    " ",
    "../x",
    "ses_\u0430",  # Cyrillic a, a look-alike
    "ses\x00nul",
)


@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.breaks_invariants("I4")
async def test_hostile_text_round_trips_exactly(store: Store, text: str) -> None:
    """Catalogue D2: hostile text."""
    session = await store.sessions.create("/work", title=text)
    stored = await store.events.publish(ev.Synthetic(session_id=session.id, text=text))
    (raw,) = await rows(store, "SELECT data FROM event WHERE id = :id", id=stored.id)
    # The stored column is the same string on both databases: the one normalization.
    assert raw[0] == codec.dumps(stored.data.model_dump(mode="json"))
    page = await store.events.read_after(session.id, 0)
    assert page.events[0].data == ev.Synthetic(session_id=session.id, text=text)
    (message,) = await store.sessions.messages(session.id)
    assert message.text == text  # type: ignore[union-attr]
    created = (await store.events.read_after(session.id)).events[0].data
    assert isinstance(created, ev.SessionCreated) and created.title == text


@pytest.mark.breaks_invariants("I4")
async def test_invalid_utf8_comes_back_as_the_original_bytes(store: Store) -> None:
    """Catalogue D2: hostile text."""
    session = await store.sessions.create("/work")
    await store.events.publish(ev.Synthetic(session_id=session.id, text=INVALID_UTF8))
    (message,) = await store.sessions.messages(session.id)
    assert message.text.encode("utf-8", "surrogateescape") == b"ok \xff\xfe \xc3\x28 end"  # type: ignore[union-attr]


async def test_search_columns_replace_what_the_database_cannot_hold(store: Store) -> None:
    """Catalogue D2: hostile text."""
    session = await store.sessions.create("/work", title="a\x00b\ud800c")
    assert session.title == "a\ufffdb\ufffdc"


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_hostile_session_ids_are_refused_and_nothing_changes(store: Store, bad: str) -> None:
    """Catalogue D3: hostile session ids."""
    session = await store.sessions.create("/work")
    before = await count(store, "event")
    for attempt in (
        store.sessions.create("/work", session_id=bad),
        store.sessions.get(bad),
        store.inputs.admit(bad, "hi"),
        store.inputs.admit(session.id, "hi", input_id=bad),
        store.claims.acquire(bad, "exec_a", "owner"),
    ):
        with pytest.raises(InvalidIdError, match="ids are 1 to 128 characters"):
            await attempt
    assert await count(store, "event") == before
    assert (await store.sessions.get(session.id)).id == session.id


async def test_an_oversized_prompt_is_refused_before_anything_is_written(
    open_test_store: object,
) -> None:
    store = await open_test_store(max_event_bytes=64 * 1024)  # type: ignore[operator]
    session = await store.sessions.create("/work")
    with pytest.raises(PayloadTooLargeError, match="above the limit of 65536 bytes") as refused:
        await store.inputs.admit(session.id, "x" * 70_000)
    # It names the setting, and suggests only what a user can do (the CLI attaches no files).
    assert "raise SESSIONFLOW_MAX_EVENT_BYTES" in str(refused.value)
    assert "attach" not in str(refused.value)
    assert await count(store, "session_input") == 0
    assert await store.events.latest_sequence(session.id) == 0


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(exclude_categories=())))
def test_codec_round_trips_any_string(text: str) -> None:
    encoded = codec.dumps({"text": text})
    encoded.encode("utf-8")  # always storable as UTF-8
    assert "\x00" not in encoded
    assert codec.loads(encoded) == {"text": text}


# A lone high surrogate and a lone low one, as two code points: not the emoji they would pair to.
SPLIT_PAIR = "\ud83d" + "\ude00"


@pytest.mark.breaks_invariants("I4", "I5")
async def test_lone_surrogates_that_would_pair_stay_two_code_points(store: Store) -> None:
    sid = (await store.sessions.create("/work")).id
    ids = {"session_id": sid, "assistant_message_id": "msg_split"}
    model = ModelRef(provider_id="scripted", id="x")
    await store.events.publish_many(
        [
            ev.StepStarted(**ids, agent="build", model=model),
            ev.TextStarted(**ids, ordinal=0),
            ev.TextDelta(**ids, ordinal=0, delta="\ud83d"),
            ev.TextDelta(**ids, ordinal=0, delta="\ude00"),
            ev.TextEnded(**ids, ordinal=0, text=SPLIT_PAIR),
        ]
    )
    events = [e.data for e in (await store.events.read_after(sid, 0)).events]
    deltas = "".join(e.delta for e in events if isinstance(e, ev.TextDelta))
    ended = next(e for e in events if isinstance(e, ev.TextEnded))
    (message,) = await store.sessions.messages(sid)
    assert isinstance(message, AssistantMessage)
    for text in (deltas, ended.text, message.content[0].text):  # type: ignore[union-attr]
        assert text == SPLIT_PAIR and len(text) == 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["\ud83d", "\ude00", "\udbff", "\udc00", "\\", "u", "d", "~"])))
def test_codec_round_trips_strings_of_surrogates_and_backslashes(pieces: list[str]) -> None:
    text = "".join(pieces)
    encoded = codec.dumps({text: [text]})
    encoded.encode("utf-8")
    assert codec.loads(encoded) == {text: [text]}
