"""What the Temporal UI's Reset button does, for the tests and ``bench/operator.py``."""

from __future__ import annotations

import uuid

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client


async def reset_workflow(client: Client, workflow_id: str, *, to: str) -> str:
    """Reset the workflow's running run to a completed workflow task, as the UI offers
    (``to``: ``first``, ``last``, ``middle``: the first one after an activity completed, or
    ``streaming``: the one that scheduled the latest model turn, which the reset run then runs
    again); returns the new run's id."""
    if to not in ("first", "last", "middle", "streaming"):
        raise ValueError(f"reset to first, last, middle or streaming, not {to!r}")
    handle = client.get_workflow_handle(workflow_id)
    history = await handle.fetch_history()
    completed = [
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    if to == "middle":
        done = next(
            e.event_id
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        )
        completed = [next(event_id for event_id in completed if event_id > done)]
    if to == "streaming":
        turn = max(
            e.event_id
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == "stream_turn"
        )
        completed = [max(event_id for event_id in completed if event_id < turn)]
    run_id = (await handle.describe()).run_id
    answer = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
            reason="an operator pressed Reset",
            workflow_task_finish_event_id=completed[0] if to == "first" else completed[-1],
            request_id=str(uuid.uuid4()),
        )
    )
    return answer.run_id
