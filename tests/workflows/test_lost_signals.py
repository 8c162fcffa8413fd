"""A ``tools_ready`` signal that fails costs nothing: the turn streams on, its result starts the
call. The failure is real: the server refuses a run's signals past a limit, here every signal
after the first ``tools_ready`` (measured: with the limit at 2, the start signal and one more
pass)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from store import Store
from tests.conftest import start_dev_server
from tests.invariants import assert_clean, final_log
from tests.workflows.harness import call, harness


@pytest.fixture(scope="module")
async def one_signal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server("history.maximumSignalsPerExecution=2")
    yield env
    await env.shutdown()


async def test_a_refused_tools_ready_signal_neither_stops_the_stream_nor_loses_the_call(
    one_signal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    async with harness(one_signal_env.client, store, tmp_path) as h:
        sid = await h.session(
            [
                call("c1", text="signalled"),
                {"text": "between calls", "chunks": 4, "delay_ms": 20},
                call("c2", text="refused"),
                {"text": "while the call waits", "chunks": 4, "delay_ms": 20},
                {"wait_for_file": h.gate_file("stream")},
            ],
            [{"text": "done"}],
        )
        await h.client.prompt(sid, "Go")

        async def streamed_on() -> bool:
            events = await h.events(sid)
            called = [e.seq for e in events if e.data.get("call_id") == "c2"]
            return bool(called) and any(
                e.type == "session.text.delta" and e.seq > called[-1] for e in events
            )

        await h.until(streamed_on)  # tokens after the refused signal are durable, live
        h.open_gate("stream")
        await h.client.wait_idle(sid, timeout=30)
        log = await final_log(store, sid)
        messages = await h.messages(sid)
    assert_clean(log)
    assert [e.data.type for e in log][-1] == "session.execution.succeeded"
    first = next(m for m in messages if m.type == "assistant")
    assert first.tool("c1").state.status == "completed"
    assert first.tool("c2").state.status == "completed"  # started from the turn's result
    texts = [p.text for p in first.content if p.type == "text"]
    assert texts == ["between calls", "while the call waits"]
