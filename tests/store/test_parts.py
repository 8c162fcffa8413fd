"""An assistant message's parts are rows of their own: an event writes what it changed.

Issue "Writes that do not grow with the session": a tool, text or reasoning event used to load,
re-serialize and rewrite its whole assistant message. These tests watch every row the store
writes (a trigger logs each insert and update with its size) and check that the write of one
event stays the size of what it changed, however large the message has grown.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from sessionflow.models import events as ev
from sessionflow.models.common import TextContent
from sessionflow.models.messages import AssistantMessage, TextPart, ToolCompleted, ToolPart
from store import Store, codec, open_store
from store.db import MIGRATIONS
from tests.conftest import Target
from tests.store.helpers import rows
from tests.store.test_projector import new_session, publish, start_step

OUTPUT = 10_000  # bytes of output per tool call

_SQLITE_LOG = [
    "CREATE TABLE write_log (tbl TEXT, bytes INTEGER)",
    *(
        f"CREATE TRIGGER log_{table}_{op.lower()} AFTER {op} ON {table} "
        f"BEGIN INSERT INTO write_log VALUES ('{table}', length(NEW.data)); END"
        for table in ("session_part", "session_message")
        for op in ("INSERT", "UPDATE")
    ),
]
_POSTGRES_LOG = [
    "CREATE TABLE write_log (tbl text, bytes int)",
    """CREATE FUNCTION log_write() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO write_log VALUES (TG_TABLE_NAME, length(NEW.data));
      RETURN NULL;
    END $$""",
    *(
        f"CREATE TRIGGER log_{table} AFTER INSERT OR UPDATE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION log_write()"
        for table in ("session_part", "session_message")
    ),
]


async def log_writes(store: Store) -> None:
    statements = _POSTGRES_LOG if store.db.dialect == "postgresql" else _SQLITE_LOG
    async with store.db.write() as tx:
        for statement in statements:
            await tx.conn.exec_driver_sql(statement)


async def written(store: Store) -> list[tuple[str, int]]:
    """Every row written since the last call: (table, bytes of its data)."""
    logged = await rows(store, "SELECT tbl, bytes FROM write_log")
    async with store.db.write() as tx:
        await tx.conn.exec_driver_sql("DELETE FROM write_log")
    return [(str(table), int(size)) for table, size in logged]


async def run_tool(store: Store, sid: str, mid: str, call: str) -> None:
    """One tool call, from its call to its result, each event in its own transaction."""
    await publish(
        store,
        ev.ToolCalled(
            session_id=sid, assistant_message_id=mid, call_id=call, name="read", input={"n": call}
        ),
    )
    await publish(
        store,
        ev.ToolSucceeded(
            session_id=sid,
            assistant_message_id=mid,
            call_id=call,
            content=[TextContent(text="o" * OUTPUT)],
            result="o" * 100,
        ),
    )


@pytest.mark.breaks_invariants("I4")
async def test_a_tool_event_writes_its_own_part_whatever_the_message_holds(store: Store) -> None:
    """After 30 calls of 10 kB output each, the 31st call's two events write its part alone
    (about one output's size), never the message's 300 kB; the message row stays small."""
    sid = await new_session(store)
    mid = await start_step(store, sid)
    for n in range(30):
        await run_tool(store, sid, mid, f"c{n}")
    await log_writes(store)

    await run_tool(store, sid, mid, "c30")
    await publish(store, ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0))
    await publish(
        store, ev.TextEnded(session_id=sid, assistant_message_id=mid, ordinal=0, text="done")
    )

    logged = await written(store)
    assert {table for table, _ in logged} == {"session_part"}, logged
    # The call (running, then completed with its output) and the text (started, then ended).
    assert len(logged) == 4, logged
    assert sum(size for _, size in logged) < 2 * OUTPUT, logged

    await publish(
        store, ev.StepEnded(session_id=sid, assistant_message_id=mid, finish="stop", cost=0.5)
    )
    logged = await written(store)
    assert [table for table, _ in logged] == ["session_message"], logged
    assert logged[0][1] < 1_000, "the message row holds no parts"

    message = (await store.sessions.messages(sid))[-1]
    assert isinstance(message, AssistantMessage)
    assert [p.call_id for p in message.content if isinstance(p, ToolPart)] == [
        f"c{n}" for n in range(31)
    ]
    assert isinstance(message.content[-1], TextPart) and message.content[-1].text == "done"
    assert (message.finish, message.cost) == ("stop", 0.5)
    part = await store.sessions.tool_part(sid, mid, "c30")
    assert part is not None and isinstance(part.state, ToolCompleted)
    assert part.state.content == [TextContent(text="o" * OUTPUT)]


@pytest.mark.breaks_invariants("I4")
@pytest.mark.unsettled  # it ends inside a busy period
async def test_events_of_one_transaction_write_each_changed_part_once(store: Store) -> None:
    """A batch of events on one message (one transaction) writes each part it touched once,
    with its final state, and nothing else."""
    sid = await new_session(store)
    mid = await start_step(store, sid)
    await run_tool(store, sid, mid, "early")
    await log_writes(store)

    claim = await store.claims.acquire(sid, "exec_a", "owner-a")
    await store.append(
        claim,
        [
            ev.TextStarted(session_id=sid, assistant_message_id=mid, ordinal=0),
            ev.TextEnded(session_id=sid, assistant_message_id=mid, ordinal=0, text="hello"),
            ev.ToolCalled(
                session_id=sid, assistant_message_id=mid, call_id="late", name="read", input={}
            ),
        ],
    )
    assert [table for table, _ in await written(store)] == ["session_part", "session_part"]
    message = (await store.sessions.messages(sid))[-1]
    assert isinstance(message, AssistantMessage)
    assert [type(p).__name__ for p in message.content] == ["ToolPart", "TextPart", "ToolPart"]


async def test_a_store_from_before_part_rows_moves_its_parts_on_open(
    target: Target, tmp_path: Path
) -> None:
    """A store written by the previous schema (0002: parts inside the message's JSON, a lone
    surrogate among them) opens at head with the same messages, its parts now rows."""
    legacy = AssistantMessage(
        id="msg_legacy",
        session_id="ses_legacy",
        seq=1,
        time_created=1,
        agent="build",
        model={"provider_id": "scripted", "id": "demo.json"},
        content=[
            TextPart(ordinal=0, text="bad \ud800 surrogate"),
            ToolPart(
                call_id="c1",
                name="read",
                state=ToolCompleted(input={}, content=[TextContent(text="out")], result="out"),
                time={"created": 1},
            ),
        ],
    )
    store = await target.open()
    await store.close()
    engine = sa.create_engine(
        target.url.replace("+aiosqlite", ""),
        **(
            {"connect_args": {"options": f"-csearch_path={target.schema}"}} if target.schema else {}
        ),
    )
    with engine.begin() as connection:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.attributes["connection"] = connection
        command.downgrade(config, "0002")
        connection.execute(
            sa.text(
                "INSERT INTO session (id, directory, title, cost, tokens_input, tokens_output,"
                " tokens_reasoning, tokens_cache_read, tokens_cache_write, claim_epoch,"
                " request_count, time_created, time_updated)"
                " VALUES ('ses_legacy', '/w', '', 0, 0, 0, 0, 0, 0, 0, 0, 1, 1)"
            )
        )
        connection.execute(
            sa.text(
                "INSERT INTO session_message (id, session_id, type, seq, time_created,"
                " time_updated, data) VALUES ('msg_legacy', 'ses_legacy', 'assistant', 1, 1, 1,"
                " :data)"
            ),
            {"data": codec.dump_model(legacy)},
        )
    engine.dispose()

    store = await open_store(target.url, schema=target.schema)
    try:
        assert await store.sessions.messages("ses_legacy") == [legacy]
        part = await store.sessions.tool_part("ses_legacy", "msg_legacy", "c1")
        assert part == legacy.content[1]
        stored = await rows(store, "SELECT count(*) FROM session_part")
        assert stored == [(2,)]
    finally:
        await store.close()


def _turn(sid: str, mid: str) -> list[list[ev.Event]]:
    """A turn's batches as its courier flushes them: text, reasoning, tool input and calls."""
    ids = {"session_id": sid, "assistant_message_id": mid}
    return [
        [ev.StepStarted(**ids, agent="build", model={"provider_id": "scripted", "id": "t.json"})],
        [ev.TextStarted(**ids, ordinal=0), ev.TextDelta(**ids, ordinal=0, delta="hel")],
        [ev.TextDelta(**ids, ordinal=0, delta="lo")],
        [
            ev.TextEnded(**ids, ordinal=0, text="hello"),
            ev.ReasoningStarted(**ids, ordinal=0),
            ev.ReasoningEnded(**ids, ordinal=0, text="hmm"),
            ev.ToolInputStarted(**ids, call_id="c1", name="read"),
        ],
        [
            ev.ToolInputEnded(**ids, call_id="c1", text='{"n": 1}'),
            ev.ToolCalled(**ids, call_id="c1", name="read", input={"n": 1}),
        ],
        [ev.ToolCalled(**ids, call_id="c2", name="read", input={"n": 2})],
    ]


def _shape(message: AssistantMessage) -> list[tuple[str, object]]:
    """The message's parts without their times (two sessions' parts differ only there)."""
    times = {"time", "time_created", "time_completed"}
    return [(type(p).__name__, p.model_dump(exclude=times)) for p in message.content]


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_turns_view_writes_what_the_general_path_writes(store: Store) -> None:
    """A turn's batches appended with its view (on PostgreSQL, a parts-only batch is projected
    on the view and written with its events in one statement) leave the same message and the
    same events as without one; the view follows every batch."""
    from store.facade import TurnView

    results = []
    for viewed in (False, True):
        sid = await new_session(store)
        mid = f"msg_view{int(viewed)}"
        claim = await store.claims.acquire(sid, f"exec_{int(viewed)}", "owner")
        view = TurnView(mid) if viewed else None
        for batch in _turn(sid, mid):
            await store.append(claim, batch, step_attempt=0, view=view)
            if view is not None and store.db.dialect == "postgresql":
                assert view.message is not None
                assert _shape(view.message) == _shape(await _message(store, sid))
        events = [(e.type, e.seq) for e in (await store.events.read_after(sid)).events]
        results.append((_shape(await _message(store, sid)), events))
    assert results[0] == results[1]


async def _written_so_far(store: Store, sid: str) -> tuple[object, ...]:
    return ((await store.events.read_after(sid)).events, _shape(await _message(store, sid)))


async def _message(store: Store, sid: str) -> AssistantMessage:
    message = (await store.sessions.messages(sid))[-1]
    assert isinstance(message, AssistantMessage)
    return message


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_turns_view_takes_one_statement_per_parts_only_batch(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL every batch of the turn after its first goes as one statement with the
    parts it changed (``_PG_PARTS``): only the first, which starts the step, takes the general
    path. On SQLite the view changes nothing (the general path runs inline)."""
    from store.facade import TurnView
    from store.write.fast import PostgresWriter

    sid = await new_session(store)
    claim = await store.claims.acquire(sid, "exec_a", "owner")
    sent: list[int | None] = []
    if isinstance(store.writer, PostgresWriter):
        original = store.writer.append

        async def spy(fence, rows, on_commit, *, parts=None):  # type: ignore[no-untyped-def]
            sent.append(None if parts is None else len(parts))
            return await original(fence, rows, on_commit, parts=parts)

        monkeypatch.setattr(store.writer, "append", spy)
    view = TurnView("msg_one")
    for batch in _turn(sid, "msg_one"):
        await store.append(claim, batch, step_attempt=0, view=view)
    if isinstance(store.writer, PostgresWriter):
        # text started; a delta alone; text ended + reasoning + input started; c1 ended and
        # called; c2 called (a new part)
        assert sent == [1, 0, 3, 1, 1]
    else:
        assert sent == []


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_view_never_rewrites_a_call_its_tool_settled(store: Store) -> None:
    """A tool part is the turn's own only until it is called: after the tool's run settled it
    (another writer), a batch touching that call id again takes the general path, which reads
    the settled part, and the view is refreshed from what that path wrote."""
    from store.facade import TurnView

    sid = await new_session(store)
    mid = "msg_settled"
    ids = {"session_id": sid, "assistant_message_id": mid}
    claim = await store.claims.acquire(sid, "exec_a", "owner")
    view = TurnView(mid)
    for batch in _turn(sid, mid)[:5]:
        await store.append(claim, batch, step_attempt=0, view=view)
    # The tool's run settles c1 outside the turn's view.
    await store.append(
        claim, [ev.ToolSucceeded(**ids, call_id="c1", content=[TextContent(text="out")])]
    )
    # The provider reuses the call id: a new part, the settled one left as it is.
    await store.append(
        claim, [ev.ToolInputStarted(**ids, call_id="c1", name="read")], step_attempt=0, view=view
    )
    message = await _message(store, sid)
    tools = [p for p in message.content if isinstance(p, ToolPart)]
    assert [type(p.state).__name__ for p in tools] == ["ToolCompleted", "ToolPending"]
    if store.db.dialect == "postgresql":
        assert view.message is not None and _shape(view.message) == _shape(message)


@pytest.mark.unsettled  # it ends inside a busy period
async def test_a_view_batch_of_a_lost_claim_writes_nothing(store: Store) -> None:
    """Catalogue F8: a parts-only batch is fenced like every other: once the claim is taken
    over, the batch raises ``ClaimLostError``, writes no event and no part, and the view is
    forgotten."""
    from sessionflow.errors import ClaimLostError
    from store.facade import TurnView

    sid = await new_session(store)
    mid = "msg_lost"
    claim = await store.claims.acquire(sid, "exec_a", "owner", lease_ms=60_000)
    view = TurnView(mid)
    batches = _turn(sid, mid)
    for batch in batches[:2]:
        await store.append(claim, batch, step_attempt=0, view=view)
    before = await _written_so_far(store, sid)
    await store.claims.release(claim)
    await store.claims.acquire(sid, "exec_b", "owner")
    with pytest.raises(ClaimLostError):
        await store.append(claim, batches[3], step_attempt=0, view=view)
    assert view.message is None
    assert (
        (await store.events.read_after(sid)).events,
        _shape(await _message(store, sid)),
    ) == before
