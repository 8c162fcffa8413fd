"""Projections from session events (reference §1.8, §4.6, §6 projection-side rules, §8.3)."""

from __future__ import annotations

from typing import Any

import pytest

from sessionflow.errors import (
    InvalidDurableEventError,
    LifecycleConflictError,
    SessionNotFoundError,
)
from sessionflow.ids import message_id
from sessionflow.models import events as ev
from sessionflow.models.common import CacheTokens, ModelRef, SessionError, TextContent, Tokens
from sessionflow.models.messages import (
    AssistantMessage,
    ReasoningPart,
    SyntheticMessage,
    TextPart,
    ToolCompleted,
    ToolError,
    ToolPart,
    ToolPending,
    ToolRunning,
)
from store import Store
from store.events import StoredEvent
from tests.store.helpers import count, statements

MODEL = ModelRef(provider_id="scripted", id="demo.json")
OTHER_MODEL = ModelRef(provider_id="other", id="big", variant="high")
BOOM = SessionError(type="provider.transport", message="connection reset", status=503)
TOOL_BOOM = SessionError(type="tool.execution", message="exit status 1")


async def new_session(store: Store) -> str:
    return (await store.sessions.create("/work")).id


async def publish(store: Store, event: ev.Event, **options: Any) -> StoredEvent:
    return await store.events.publish(event, **options)


async def start_step(
    store: Store,
    sid: str,
    mid: str | None = None,
    *,
    agent: str = "build",
    model: ModelRef = MODEL,
    created: int | None = None,
) -> str:
    mid = mid or message_id()
    event = ev.StepStarted(session_id=sid, assistant_message_id=mid, agent=agent, model=model)
    await publish(store, event, created=created)
    return mid


async def assistant(store: Store, sid: str, mid: str) -> AssistantMessage:
    for message in await store.sessions.messages(sid):
        if message.id == mid:
            assert isinstance(message, AssistantMessage)
            return message
    raise AssertionError(f"no message {mid}")


async def tool(store: Store, sid: str, mid: str, index: int = -1) -> ToolPart:
    parts = [p for p in (await assistant(store, sid, mid)).content if isinstance(p, ToolPart)]
    return parts[index]


async def event_types(store: Store, sid: str) -> list[str]:
    return [stored.type for stored in (await store.events.read_after(sid)).events]


# --- steps --------------------------------------------------------------------------------------


@pytest.mark.breaks_invariants("I4", "I5")
async def test_step_started_appends_an_assistant_message(store: Store) -> None:
    sid = await new_session(store)
    mid = message_id()
    stored = await publish(
        store, ev.StepStarted(session_id=sid, assistant_message_id=mid, agent="plan", model=MODEL)
    )
    messages = await store.sessions.messages(sid)
    assert len(messages) == 1
    message = messages[0]
    assert isinstance(message, AssistantMessage)
    assert (message.id, message.session_id, message.seq) == (mid, sid, stored.seq)
    assert (message.agent, message.model) == ("plan", MODEL)
    assert message.time_created == stored.created
    assert message.time_completed is None
    assert message.content == []
    assert (message.finish, message.error, message.retry, message.tokens) == (None,) * 4


@pytest.mark.breaks_invariants("I4", "I5")
async def test_new_step_completes_the_previous_incomplete_assistant(store: Store) -> None:
    sid = await new_session(store)
    first = await start_step(store, sid, created=1_000)
    second = await start_step(store, sid, created=2_000)
    assert (await assistant(store, sid, first)).time_completed == 2_000
    assert (await assistant(store, sid, second)).time_completed is None
    assert [m.id for m in await store.sessions.messages(sid)] == [first, second]


@pytest.mark.breaks_invariants("I4", "I5")
async def test_a_new_step_reads_the_messages_once(store: Store) -> None:
    """Issue 14 item 3: whether the step's message exists and which assistant message came
    last are one read (``_STEP_OPENING``): on PostgreSQL the start of a step after a finished
    one is its sequence, that read, the message insert and the event insert."""
    sid = await new_session(store)
    first = await start_step(store, sid, created=1_000)
    ended = ev.StepEnded(session_id=sid, assistant_message_id=first, finish="stop")
    await publish(store, ended, created=1_500)
    with statements(store) as sent:
        second = await start_step(store, sid, created=2_000)
    if store.db.dialect == "postgresql":
        assert len(sent) == 4, sent
    assert (await assistant(store, sid, first)).time_completed == 1_500
    assert (await assistant(store, sid, second)).time_completed is None


@pytest.mark.breaks_invariants("I4", "I5")
async def test_steps_started_in_one_transaction_see_each_other(store: Store) -> None:
    """The second start's read comes after the first's writes (a write-back first): the first
    message, started in the same transaction, is the one the second supersedes."""
    sid = await new_session(store)
    first, second = message_id(), message_id()
    await store.events.publish_many(
        [
            ev.StepStarted(session_id=sid, assistant_message_id=mid, agent="build", model=MODEL)
            for mid in (first, second)
        ]
    )
    assert (await assistant(store, sid, first)).time_completed is not None
    assert (await assistant(store, sid, second)).time_completed is None


@pytest.mark.breaks_invariants("I4", "I5")
async def test_new_step_keeps_the_completion_time_of_a_finished_assistant(store: Store) -> None:
    sid = await new_session(store)
    first = await start_step(store, sid, created=1_000)
    await publish(
        store,
        ev.StepEnded(session_id=sid, assistant_message_id=first, finish="stop"),
        created=1_500,
    )
    await start_step(store, sid, created=2_000)
    assert (await assistant(store, sid, first)).time_completed == 1_500


@pytest.mark.breaks_invariants("I4")
async def test_step_started_again_for_the_same_id_resets_the_attempt(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid, created=1_000)
    await publish(store, ev.StepFailed(session_id=sid, assistant_message_id=mid, error=BOOM))
    retry = ev.RetryScheduled(
        session_id=sid, assistant_message_id=mid, attempt=2, at=5_000, error=BOOM
    )
    await publish(store, retry)
    before = await assistant(store, sid, mid)
    assert before.finish == "error"
    assert before.error == BOOM
    assert before.retry is not None
    assert before.time_completed is not None

    await start_step(store, sid, mid, agent="plan", model=OTHER_MODEL, created=9_000)

    messages = await store.sessions.messages(sid)
    assert len(messages) == 1
    after = messages[0]
    assert isinstance(after, AssistantMessage)
    assert (after.retry, after.error, after.finish, after.time_completed) == (None,) * 4
    assert (after.agent, after.model) == ("plan", OTHER_MODEL)
    assert after.seq == before.seq
    assert after.time_created == 1_000


@pytest.mark.breaks_invariants("I4")
async def test_step_ended_settles_the_assistant(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    tokens = Tokens(input=10, output=4, reasoning=2, cache=CacheTokens(read=3, write=1))
    ended = await publish(
        store,
        ev.StepEnded(
            session_id=sid,
            assistant_message_id=mid,
            finish="tool-calls",
            cost=0.25,
            tokens=tokens,
            files=("a.py", "b/c.txt"),
        ),
    )
    message = await assistant(store, sid, mid)
    assert message.finish == "tool-calls"
    assert message.cost == 0.25
    assert message.tokens == tokens
    assert message.files == ["a.py", "b/c.txt"]
    assert message.time_completed == ended.created
    assert message.error is None


@pytest.mark.breaks_invariants("I4")
async def test_step_usage_accumulates_on_the_session(store: Store) -> None:
    sid = await new_session(store)
    fresh = await store.sessions.get(sid)
    assert (fresh.cost, fresh.tokens) == (0.0, Tokens())
    first = await start_step(store, sid)
    await publish(
        store,
        ev.StepEnded(
            session_id=sid,
            assistant_message_id=first,
            finish="tool-calls",
            cost=0.25,
            tokens=Tokens(input=10, output=4, reasoning=2, cache=CacheTokens(read=3, write=1)),
        ),
    )
    second = await start_step(store, sid)
    await publish(
        store,
        ev.StepEnded(
            session_id=sid,
            assistant_message_id=second,
            finish="stop",
            cost=0.5,
            tokens=Tokens(input=1, output=2, reasoning=3, cache=CacheTokens(read=4, write=5)),
        ),
    )
    info = await store.sessions.get(sid)
    assert info.cost == pytest.approx(0.75)
    assert info.tokens == Tokens(
        input=11, output=6, reasoning=5, cache=CacheTokens(read=7, write=6)
    )


@pytest.mark.breaks_invariants("I4")
async def test_step_failed_marks_the_assistant_failed_and_clears_retry(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    retry = ev.RetryScheduled(
        session_id=sid, assistant_message_id=mid, attempt=1, at=5_000, error=BOOM
    )
    await publish(store, retry)
    assert (await assistant(store, sid, mid)).retry is not None
    failed = await publish(
        store,
        ev.StepFailed(
            session_id=sid,
            assistant_message_id=mid,
            error=BOOM,
            cost=0.125,
            tokens=Tokens(input=7, output=1),
        ),
    )
    message = await assistant(store, sid, mid)
    assert message.finish == "error"
    assert message.error == BOOM
    assert message.retry is None
    assert message.time_completed == failed.created
    assert message.tokens == Tokens(input=7, output=1)
    info = await store.sessions.get(sid)
    assert info.cost == pytest.approx(0.125)
    assert (info.tokens.input, info.tokens.output) == (7, 1)


@pytest.mark.breaks_invariants("I4")
async def test_step_failed_without_usage_leaves_the_session_totals(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(store, ev.StepFailed(session_id=sid, assistant_message_id=mid, error=BOOM))
    info = await store.sessions.get(sid)
    assert (info.cost, info.tokens) == (0.0, Tokens())
    assert (await assistant(store, sid, mid)).finish == "error"


@pytest.mark.breaks_invariants("I4", "I5")
async def test_retry_scheduled_records_the_retry(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    retry = ev.RetryScheduled(
        session_id=sid, assistant_message_id=mid, attempt=3, at=123_456, error=BOOM
    )
    await publish(store, retry)
    message = await assistant(store, sid, mid)
    assert message.retry is not None
    assert (message.retry.attempt, message.retry.at, message.retry.error) == (3, 123_456, BOOM)


@pytest.mark.parametrize(
    "terminal",
    [
        lambda sid: ev.ExecutionSucceeded(session_id=sid, execution_id="exec-1"),
        lambda sid: ev.ExecutionFailed(session_id=sid, execution_id="exec-1", error=BOOM),
        lambda sid: ev.ExecutionInterrupted(session_id=sid, execution_id="exec-1"),
    ],
    ids=["succeeded", "failed", "interrupted"],
)
@pytest.mark.breaks_invariants("I4", "I5")
async def test_execution_terminal_events_clear_the_retry(store: Store, terminal: Any) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    retry = ev.RetryScheduled(
        session_id=sid, assistant_message_id=mid, attempt=1, at=5_000, error=BOOM
    )
    await publish(store, retry)
    await publish(store, terminal(sid))
    assert (await assistant(store, sid, mid)).retry is None


# --- text and reasoning -------------------------------------------------------------------------


@pytest.mark.breaks_invariants("I4", "I5")
async def test_text_started_and_ended_project_the_full_text(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(store, ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0))
    assert (await assistant(store, sid, mid)).content == [TextPart(ordinal=0, text="")]
    await publish(
        store, ev.TextEnded(session_id=sid, assistant_message_id=mid, ordinal=0, text="Hello")
    )
    await publish(store, ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=1))
    await publish(
        store, ev.TextEnded(session_id=sid, assistant_message_id=mid, ordinal=1, text="World")
    )
    assert (await assistant(store, sid, mid)).content == [
        TextPart(ordinal=0, text="Hello"),
        TextPart(ordinal=1, text="World"),
    ]


@pytest.mark.breaks_invariants("I4")
async def test_partial_text_of_a_failed_step_is_kept(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(store, ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0))
    await publish(
        store, ev.TextEnded(session_id=sid, assistant_message_id=mid, ordinal=0, text="Hel")
    )
    await publish(store, ev.StepFailed(session_id=sid, assistant_message_id=mid, error=BOOM))
    message = await assistant(store, sid, mid)
    assert message.content == [TextPart(ordinal=0, text="Hel")]
    assert message.finish == "error"


@pytest.mark.breaks_invariants("I4", "I5")
async def test_reasoning_keeps_provider_state_and_times(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    started = await publish(
        store,
        ev.ReasoningStarted(
            session_id=sid, assistant_message_id=mid, ordinal=0, state={"signature": "a"}
        ),
    )
    part = (await assistant(store, sid, mid)).content[0]
    assert isinstance(part, ReasoningPart)
    assert (part.text, part.state, part.time_completed) == ("", {"signature": "a"}, None)
    assert part.time_created == started.created

    ended = await publish(
        store,
        ev.ReasoningEnded(
            session_id=sid,
            assistant_message_id=mid,
            ordinal=0,
            text="thinking...",
            state={"signature": "b"},
        ),
        created=started.created + 10,
    )
    (part,) = (await assistant(store, sid, mid)).content
    assert isinstance(part, ReasoningPart)
    assert part.text == "thinking..."
    assert part.state == {"signature": "b"}
    assert part.time_created == started.created
    assert part.time_completed == ended.created


@pytest.mark.breaks_invariants("I4", "I5")
async def test_reasoning_ended_without_state_keeps_the_started_state(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ReasoningStarted(
            session_id=sid, assistant_message_id=mid, ordinal=0, state={"signature": "a"}
        ),
    )
    await publish(
        store,
        ev.ReasoningEnded(session_id=sid, assistant_message_id=mid, ordinal=0, text="partial"),
    )
    (part,) = (await assistant(store, sid, mid)).content
    assert isinstance(part, ReasoningPart)
    assert (part.text, part.state) == ("partial", {"signature": "a"})
    assert part.time_completed is not None


@pytest.mark.breaks_invariants("I4", "I5")
async def test_deltas_are_logged_but_not_projected(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(store, ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0))
    await publish(store, ev.ReasoningStarted(session_id=sid, assistant_message_id=mid, ordinal=1))
    await publish(
        store, ev.ToolInputStarted(session_id=sid, assistant_message_id=mid, call_id="c1", name="x")
    )
    before = await store.sessions.messages(sid)

    deltas = [
        ev.TextDelta(session_id=sid, assistant_message_id=mid, ordinal=0, delta="Hel"),
        ev.ReasoningDelta(session_id=sid, assistant_message_id=mid, ordinal=1, delta="hmm"),
        ev.ToolInputDelta(session_id=sid, assistant_message_id=mid, call_id="c1", delta='{"a"'),
    ]
    for delta in deltas:
        await publish(store, delta)

    assert await store.sessions.messages(sid) == before
    types = await event_types(store, sid)
    assert types[-3:] == [
        "session.text.delta.1",
        "session.reasoning.delta.1",
        "session.tool.input.delta.1",
    ]
    logged = (await store.events.read_after(sid)).events[-3:]
    assert [stored.data for stored in logged] == deltas


@pytest.mark.breaks_invariants("I4")
async def test_a_delta_for_an_unknown_assistant_is_still_logged(store: Store) -> None:
    sid = await new_session(store)
    delta = ev.TextDelta(session_id=sid, assistant_message_id="msg_nowhere", ordinal=0, delta="x")
    stored = await publish(store, delta)
    assert stored.seq == 1
    assert await store.sessions.messages(sid) == []


# --- tools --------------------------------------------------------------------------------------


@pytest.mark.breaks_invariants("I4", "I5")
async def test_tool_moves_from_pending_through_running_to_completed(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    created = await publish(
        store,
        ev.ToolInputStarted(session_id=sid, assistant_message_id=mid, call_id="c1", name="read"),
    )
    part = await tool(store, sid, mid)
    assert (part.call_id, part.name) == ("c1", "read")
    assert part.state == ToolPending(input="")
    assert part.time.created == created.created

    await publish(
        store,
        ev.ToolInputEnded(
            session_id=sid, assistant_message_id=mid, call_id="c1", text='{"path": "a.py"}'
        ),
    )
    assert (await tool(store, sid, mid)).state == ToolPending(input='{"path": "a.py"}')

    called = await publish(
        store,
        ev.ToolCalled(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            name="read",
            input={"path": "a.py"},
            executed=True,
            state={"item": "fc_1"},
        ),
        created=created.created + 1,
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolRunning(input={"path": "a.py"})
    assert part.executed is True
    assert part.provider_state == {"item": "fc_1"}
    assert part.time.ran == called.created
    assert part.time.completed is None

    await publish(
        store,
        ev.ToolProgress(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            structured={"lines": 10},
            content=(TextContent(text="reading"),),
        ),
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolRunning(
        input={"path": "a.py"},
        structured={"lines": 10},
        content=[TextContent(text="reading")],
    )

    done = await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            structured={"lines": 20},
            content=(TextContent(text="file body"),),
            output_paths=("/tmp/out.txt",),
            result={"raw": 1},
            executed=True,
            result_state={"done": True},
        ),
        created=created.created + 2,
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolCompleted(
        input={"path": "a.py"},
        structured={"lines": 20},
        content=[TextContent(text="file body")],
        output_paths=["/tmp/out.txt"],
        result={"raw": 1},
    )
    assert part.provider_result_state == {"done": True}
    assert part.time.completed == done.created
    assert part.time.ran == called.created
    assert len((await assistant(store, sid, mid)).content) == 1


@pytest.mark.breaks_invariants("I4", "I5", "I6")
async def test_tool_called_without_input_events_creates_a_running_part(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=mid, call_id="c1", name="glob", input={"p": "*"}
        ),
    )
    part = await tool(store, sid, mid)
    assert (part.call_id, part.name) == ("c1", "glob")
    assert part.state == ToolRunning(input={"p": "*"})
    assert part.time.ran is not None


@pytest.mark.breaks_invariants("I4", "I5")
async def test_tool_failed_while_running_keeps_input_and_progress(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=mid, call_id="c1", name="bash", input={"cmd": "x"}
        ),
    )
    await publish(
        store,
        ev.ToolProgress(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            structured={"pid": 7},
            content=(TextContent(text="partial output"),),
        ),
    )
    failed = await publish(
        store,
        ev.ToolFailed(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            error=TOOL_BOOM,
            result="stderr",
            result_state={"k": 1},
        ),
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolError(
        error=TOOL_BOOM,
        input={"cmd": "x"},
        structured={"pid": 7},
        content=[TextContent(text="partial output")],
        result="stderr",
    )
    assert part.provider_result_state == {"k": 1}
    assert part.time.completed == failed.created


@pytest.mark.breaks_invariants("I4", "I5")
async def test_tool_failed_while_pending_replaces_the_raw_input(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ToolInputStarted(session_id=sid, assistant_message_id=mid, call_id="c1", name="edit"),
    )
    await publish(
        store,
        ev.ToolInputEnded(session_id=sid, assistant_message_id=mid, call_id="c1", text='{"pa'),
    )
    stale = SessionError(type="tool.stale", message="Tool execution interrupted: edit")
    await publish(
        store, ev.ToolFailed(session_id=sid, assistant_message_id=mid, call_id="c1", error=stale)
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolError(error=stale, input={})
    assert part.time.completed is not None


@pytest.mark.breaks_invariants("I4", "I5")
async def test_tool_success_applies_only_to_a_running_tool(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ToolInputStarted(session_id=sid, assistant_message_id=mid, call_id="c1", name="read"),
    )
    await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=mid,
            call_id="c1",
            content=(TextContent(text="never"),),
        ),
    )
    part = await tool(store, sid, mid)
    assert part.state == ToolPending(input="")
    assert part.time.completed is None


@pytest.mark.breaks_invariants("I3", "I4", "I5", "I6")
async def test_settled_tools_are_never_overwritten(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    for call_id in ("ok", "bad"):
        await publish(
            store,
            ev.ToolCalled(
                session_id=sid, assistant_message_id=mid, call_id=call_id, name="t", input={}
            ),
        )
    await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=mid,
            call_id="ok",
            content=(TextContent(text="first"),),
        ),
    )
    await publish(
        store, ev.ToolFailed(session_id=sid, assistant_message_id=mid, call_id="bad", error=BOOM)
    )
    settled = await assistant(store, sid, mid)

    late: list[ev.Event] = []
    for call_id in ("ok", "bad"):
        late += [
            ev.ToolInputEnded(session_id=sid, assistant_message_id=mid, call_id=call_id, text="{"),
            ev.ToolCalled(
                session_id=sid,
                assistant_message_id=mid,
                call_id=call_id,
                name="t",
                input={"again": True},
            ),
            ev.ToolProgress(
                session_id=sid,
                assistant_message_id=mid,
                call_id=call_id,
                structured={"late": True},
            ),
            ev.ToolSucceeded(
                session_id=sid,
                assistant_message_id=mid,
                call_id=call_id,
                content=(TextContent(text="second"),),
            ),
            ev.ToolFailed(
                session_id=sid, assistant_message_id=mid, call_id=call_id, error=TOOL_BOOM
            ),
        ]
    for event in late:
        await publish(store, event)

    after = await assistant(store, sid, mid)
    assert after.content == settled.content
    ok, bad = after.content
    assert isinstance(ok, ToolPart)
    assert isinstance(bad, ToolPart)
    assert ok.state == ToolCompleted(content=[TextContent(text="first")])
    assert bad.state == ToolError(error=BOOM)


@pytest.mark.breaks_invariants("I4", "I5")
async def test_a_reused_call_id_settles_against_its_own_message(store: Store) -> None:
    """Catalogue P3: a call id reused across turns."""
    sid = await new_session(store)
    first = await start_step(store, sid)
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=first, call_id="tool_0", name="t", input={"n": 1}
        ),
    )
    second = await start_step(store, sid)
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=second, call_id="tool_0", name="t", input={"n": 2}
        ),
    )
    await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=second,
            call_id="tool_0",
            content=(TextContent(text="two"),),
        ),
    )
    assert (await tool(store, sid, first)).state == ToolRunning(input={"n": 1})
    assert (await tool(store, sid, second)).state == ToolCompleted(
        input={"n": 2}, content=[TextContent(text="two")]
    )

    await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=first,
            call_id="tool_0",
            content=(TextContent(text="one"),),
        ),
    )
    assert (await tool(store, sid, first)).state == ToolCompleted(
        input={"n": 1}, content=[TextContent(text="one")]
    )
    assert (await tool(store, sid, second)).state == ToolCompleted(
        input={"n": 2}, content=[TextContent(text="two")]
    )
    assert len((await assistant(store, sid, first)).content) == 1
    assert len((await assistant(store, sid, second)).content) == 1


@pytest.mark.breaks_invariants("I3", "I4", "I5", "I6")
async def test_a_call_id_restarted_after_settlement_updates_the_latest_part(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await publish(
        store,
        ev.ToolCalled(session_id=sid, assistant_message_id=mid, call_id="c", name="t", input={}),
    )
    await publish(
        store, ev.ToolFailed(session_id=sid, assistant_message_id=mid, call_id="c", error=BOOM)
    )
    await publish(
        store, ev.ToolInputStarted(session_id=sid, assistant_message_id=mid, call_id="c", name="t")
    )
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=mid, call_id="c", name="t", input={"n": 2}
        ),
    )
    await publish(store, ev.ToolSucceeded(session_id=sid, assistant_message_id=mid, call_id="c"))
    first, second = (await assistant(store, sid, mid)).content
    assert isinstance(first, ToolPart)
    assert isinstance(second, ToolPart)
    assert first.state == ToolError(error=BOOM)
    assert second.state == ToolCompleted(input={"n": 2})


@pytest.mark.breaks_invariants("I4", "I5", "I6")
async def test_tool_part_reads_the_latest_part_of_a_call_alone(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    for n in (1, 2):
        if n == 2:
            restarted = ev.ToolInputStarted(
                session_id=sid, assistant_message_id=mid, call_id="c", name="t"
            )
            await publish(store, restarted)
        called = ev.ToolCalled(
            session_id=sid, assistant_message_id=mid, call_id="c", name="t", input={"n": n}
        )
        await publish(store, called)
        if n == 1:
            failed = ev.ToolFailed(
                session_id=sid, assistant_message_id=mid, call_id="c", error=BOOM
            )
            await publish(store, failed)
    part = await store.sessions.tool_part(sid, mid, "c")
    assert part == await tool(store, sid, mid)
    assert part is not None and part.state == ToolRunning(input={"n": 2})
    assert await store.sessions.tool_part(sid, mid, "other") is None
    assert await store.sessions.tool_part(sid, "msg_missing", "c") is None
    receipt = await store.inputs.admit(sid, "hi")
    await publish(store, ev.PromptPromoted(session_id=sid, input_id=receipt.id))
    assert await store.sessions.tool_part(sid, receipt.id, "c") is None


@pytest.mark.breaks_invariants("I4", "I5", "I6")
async def test_tool_call_reads_the_session_and_the_part_in_one(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    called = ev.ToolCalled(
        session_id=sid, assistant_message_id=mid, call_id="c", name="t", input={"n": 1}
    )
    await publish(store, called)
    session, stored = await store.sessions.tool_call(sid, mid, "c")
    assert session == await store.sessions.get(sid)
    assert stored is not None and stored.part == await store.sessions.tool_part(sid, mid, "c")
    assert stored.part.state == ToolRunning(input={"n": 1})
    assert stored.position == 0 and ToolPart.model_validate_json(stored.data) == stored.part
    assert (await store.sessions.tool_call(sid, "msg_missing", "c"))[1] is None
    with pytest.raises(SessionNotFoundError):
        await store.sessions.tool_call("ses_missing", mid, "c")


# --- synthetic ----------------------------------------------------------------------------------


@pytest.mark.breaks_invariants("I4")
async def test_synthetic_message_id_is_derived_from_the_event_id(store: Store) -> None:
    sid = await new_session(store)
    stored = await publish(
        store,
        ev.Synthetic(
            session_id=sid, text="Continue.", description="restart", metadata={"reason": "boot"}
        ),
        id="evt_0123abcdef",
    )
    (message,) = await store.sessions.messages(sid)
    assert isinstance(message, SyntheticMessage)
    assert message.id == "msg_0123abcdef"
    assert (message.session_id, message.seq, message.time_created) == (
        sid,
        stored.seq,
        stored.created,
    )
    assert (message.text, message.description, message.metadata) == (
        "Continue.",
        "restart",
        {"reason": "boot"},
    )


@pytest.mark.breaks_invariants("I4")
async def test_generated_synthetic_ids_follow_their_events(store: Store) -> None:
    sid = await new_session(store)
    one = await publish(store, ev.Synthetic(session_id=sid, text="one"))
    two = await publish(store, ev.Synthetic(session_id=sid, text="two"))
    messages = await store.sessions.messages(sid)
    assert [m.id for m in messages] == [
        "msg_" + one.id.removeprefix("evt_"),
        "msg_" + two.id.removeprefix("evt_"),
    ]
    assert [m.seq for m in messages] == [one.seq, two.seq]


# --- failures roll back -------------------------------------------------------------------------


async def test_a_tool_event_for_an_unknown_assistant_rolls_back_the_publish(store: Store) -> None:
    sid = await new_session(store)
    latest = await store.events.latest_sequence(sid)
    event = ev.ToolCalled(
        session_id=sid, assistant_message_id="msg_missing", call_id="c", name="t", input={}
    )
    with pytest.raises(InvalidDurableEventError, match="before assistant step start"):
        await publish(store, event, id="evt_orphan_tool")
    assert await count(store, "event", "id = :id", id="evt_orphan_tool") == 0
    assert await store.events.latest_sequence(sid) == latest
    assert await store.sessions.messages(sid) == []


@pytest.mark.breaks_invariants("I4", "I5")
async def test_settling_an_unknown_call_rolls_back_the_publish(store: Store) -> None:
    sid = await new_session(store)
    mid = await start_step(store, sid)
    latest = await store.events.latest_sequence(sid)
    before = await store.sessions.messages(sid)
    event = ev.ToolSucceeded(session_id=sid, assistant_message_id=mid, call_id="ghost")
    with pytest.raises(InvalidDurableEventError, match="Unknown tool call: ghost"):
        await publish(store, event)
    assert await store.events.latest_sequence(sid) == latest
    assert await count(store, "event", "aggregate_id = :sid", sid=sid) == latest + 1
    assert await store.sessions.messages(sid) == before


async def test_a_failing_projector_rolls_back_the_whole_batch(store: Store) -> None:
    sid = await new_session(store)
    latest = await store.events.latest_sequence(sid)
    mid = message_id()
    batch: list[ev.Event] = [
        ev.StepStarted(session_id=sid, assistant_message_id=mid, agent="a", model=MODEL),
        ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0),
        ev.StepEnded(session_id=sid, assistant_message_id="msg_other", finish="stop", cost=1.0),
    ]
    with pytest.raises(InvalidDurableEventError):
        await store.events.publish_many(batch)
    assert await store.events.latest_sequence(sid) == latest
    assert await count(store, "event", "aggregate_id = :sid", sid=sid) == latest + 1
    assert await store.sessions.messages(sid) == []
    assert (await store.sessions.get(sid)).cost == 0.0


@pytest.mark.breaks_invariants("I4", "I5")
async def test_a_message_id_collision_rolls_back_the_publish(store: Store) -> None:
    sid = await new_session(store)
    await start_step(store, sid, "msg_collide")
    latest = await store.events.latest_sequence(sid)
    with pytest.raises(LifecycleConflictError):
        await publish(store, ev.Synthetic(session_id=sid, text="clash"), id="evt_collide")
    assert await count(store, "event", "id = :id", id="evt_collide") == 0
    assert await store.events.latest_sequence(sid) == latest
    assert [m.type for m in await store.sessions.messages(sid)] == ["assistant"]
