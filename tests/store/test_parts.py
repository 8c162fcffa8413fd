"""An assistant message's parts are rows of their own: an event writes what it changed.

Issue "Writes that do not grow with the session": a tool, text or reasoning event used to load,
re-serialize and rewrite its whole assistant message. These tests watch every row the store
writes (a trigger logs each insert and update with its size) and check that the write of one
event stays the size of what it changed, however large the message has grown.
"""

from __future__ import annotations

from pathlib import Path

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
