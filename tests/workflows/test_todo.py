"""``todowrite`` / ``todoread``: the session's todo list as events, surviving a worker restart
and a compaction (carried into the summary verbatim). Real Temporal, both databases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from activities.tools.todo import render
from sessionflow.models.events import Todo
from sessionflow.models.messages import CompactionMessage, ToolCompleted
from store import Store
from tests.workflows.harness import call, harness

TODOS = [
    {"content": "Read the failing test", "status": "completed", "priority": "high"},
    {"content": "Fix the parser", "status": "in_progress", "priority": "high"},
    {"content": "Update the changelog", "status": "pending", "priority": "low"},
]


def _outputs(messages: list[Any], call_id: str) -> str:
    (state,) = [
        part.state
        for m in messages
        if m.type == "assistant"
        for part in m.content
        if getattr(part, "call_id", None) == call_id
    ]
    assert isinstance(state, ToolCompleted), state
    return "".join(getattr(p, "text", "") for p in state.content)


async def test_the_todo_list_survives_a_worker_restart_and_a_compaction(
    temporal_env: WorkflowEnvironment, store: Store, tmp_path: Path
) -> None:
    listed = render([Todo.model_validate(t) for t in TODOS])
    async with harness(temporal_env.client, store, tmp_path, start_worker=False) as h:
        sid = await h.session(
            [call("w", "todowrite", todos=TODOS)],
            [{"text": "planned"}],
            [{"text": "the summary"}],
            [call("r", "todoread")],
            [{"text": "carrying on"}],
            compaction={"keep_tokens": 20, "buffer": 0},
        )
        async with h.worker():
            await h.client.prompt(sid, "Plan it")
            await h.client.wait_idle(sid, timeout=30)
            # The Temporal UI's current details show the list as the call replaced it.
            metadata = await h.client._handle(sid).query("__temporal_workflow_metadata")
            shown = metadata.current_details
            assert "**todo**\n- [x] Read the failing test\n- [>] Fix the parser\n" in shown
            assert shown.endswith("- [ ] Update the changelog")
        async with h.worker():  # another worker: nothing of the list lives in a process
            await h.client.compact(sid)
            await h.client.wait_idle(sid, timeout=30)
            await h.client.prompt(sid, "Go on")
            await h.client.wait_idle(sid, timeout=30)
        messages = await h.messages(sid)
        types = await h.types(sid)
        requests = h.requests()
    assert _outputs(messages, "w") == listed
    assert _outputs(messages, "r") == listed  # read back from the store after the restart
    assert types.count("session.todo.updated") == 1
    (compaction,) = [m for m in messages if isinstance(m, CompactionMessage)]
    assert compaction.summary == f"the summary\n\n{listed}"
    # The next request after the compaction shows the model its list verbatim.
    after = [m for m in requests[3]["messages"] if m["role"] == "user"]
    assert listed in after[0]["content"][0]["text"]
    assert listed.splitlines()[0] == "Todo list (1/3 completed):"
