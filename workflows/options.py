"""Activity options of the session drain, and ``call``: an activity by name, typed.

Workflow code only (no I/O): the drain and its components (``workflows/hosts.py``) share them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

T = TypeVar("T")


# How long a remote activity may wait in its queue for a worker on top of running (catalogue
# C7: a task lost between a worker's poll and its start is found by the schedule-to-close
# bound, as a running one is by its heartbeat or start-to-close).
QUEUE_WAIT = timedelta(hours=1)
# The default bound on waiting for a claim another live execution holds (the worker's
# ``SESSIONFLOW_CLAIM_WAIT_S`` replaces it): then the busy period fails "claim.timeout".
CLAIM_WAIT = timedelta(hours=1)


@dataclass(frozen=True)
class Options:
    start_to_close: timedelta
    retry: RetryPolicy
    # Every attempt, retry waits and queue time together (C7): never None for a real option.
    schedule_to_close: timedelta | None = None
    heartbeat: timedelta | None = None
    # Interruptible activities heartbeat; the workflow waits until they really stopped.
    cancellation: workflow.ActivityCancellationType = workflow.ActivityCancellationType.TRY_CANCEL
    # Short bookkeeping runs as a local activity: in the workflow's own task, saving a
    # round trip through the server (~35 ms here) on the path between two model turns.
    local: bool = False
    # Where it runs (None: the workflow's own queue), and how long it may wait for a worker.
    task_queue: str | None = None
    schedule_to_start: timedelta | None = None


# Settlement activities are short and always run to the end, even when an interrupt cancels
# the drain: cutting one off would race its commit against the busy period's terminal event.
SHORT = Options(
    timedelta(seconds=60),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_interval=timedelta(seconds=10),
        maximum_attempts=20,
        non_retryable_error_types=["ClaimLostError", "StaleAttemptError"],
    ),
    schedule_to_close=timedelta(minutes=30),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    local=True,
)
CLAIM = Options(
    timedelta(seconds=60),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_interval=timedelta(seconds=30),
        non_retryable_error_types=[
            "ClaimLostError",
            "SessionNotFoundError",
            "InvalidIdError",
            "InvalidInputError",
        ],
    ),
    schedule_to_close=CLAIM_WAIT,
    # An attempt that runs when the interrupt lands finishes, so a granted claim is known
    # (and released with the terminal event) rather than left behind.
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
)
# The common case -- nobody else holds the claim -- as one attempt inside the workflow task;
# anything else (a held claim, a database blip) goes on to CLAIM and its retries.
CLAIM_AT_ONCE = Options(
    timedelta(seconds=60),
    RetryPolicy(maximum_attempts=1),
    schedule_to_close=timedelta(seconds=60),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    local=True,
)
# The drain owns provider retries (reference §4.7), so Temporal never re-runs a turn.
TURN = Options(
    timedelta(minutes=30),
    RetryPolicy(maximum_attempts=1),
    schedule_to_close=timedelta(minutes=30) + QUEUE_WAIT,
    heartbeat=timedelta(seconds=5),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
)
# A compaction is idempotent per compaction id, so Temporal may retry it (a killed worker).
COMPACT = Options(
    timedelta(minutes=30),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_attempts=3,
        non_retryable_error_types=["ClaimLostError", "StaleAttemptError"],
    ),
    schedule_to_close=3 * timedelta(minutes=30) + QUEUE_WAIT,
    heartbeat=timedelta(seconds=5),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
)
TOOL = Options(
    timedelta(hours=2),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=200),
        maximum_attempts=3,
        non_retryable_error_types=["ClaimLostError", "StaleAttemptError"],
    ),
    schedule_to_close=3 * timedelta(hours=2) + QUEUE_WAIT,
    heartbeat=timedelta(seconds=5),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
)
# A revert restores files and records it last; planning again finds what a killed attempt
# already restored, so Temporal may retry it (a killed worker: the heartbeat notices).
REVERT = Options(
    timedelta(minutes=10),
    RetryPolicy(
        initial_interval=timedelta(milliseconds=500),
        maximum_attempts=5,
        non_retryable_error_types=["ClaimLostError", "SessionNotFoundError"],
    ),
    schedule_to_close=5 * timedelta(minutes=10) + QUEUE_WAIT,
    heartbeat=timedelta(seconds=5),
    cancellation=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    schedule_to_start=timedelta(seconds=30),
)


async def call(name: str, arg: Any, result_type: type[T], summary: str, options: Options) -> T:
    """Run an activity by name (workflows hold no activity code) with typed input and output."""
    if options.local:
        try:
            return await _local(name, arg, result_type, summary, options)
        except FailureError as failure:
            if isinstance(failure, ActivityError):
                raise
            # A local activity's failure reaches the workflow bare (temporalio 1.35): raise it
            # as an activity's, so every handler of activity failures sees it alike.
            raise ActivityError(
                f"local activity {name} failed",
                scheduled_event_id=0,
                started_event_id=0,
                identity="",
                activity_type=name,
                activity_id="",
                retry_state=None,
            ) from failure
    result = await workflow.execute_activity(
        name,
        arg,
        result_type=result_type,
        task_queue=options.task_queue,
        schedule_to_start_timeout=options.schedule_to_start,
        schedule_to_close_timeout=options.schedule_to_close,
        start_to_close_timeout=options.start_to_close,
        heartbeat_timeout=options.heartbeat,
        retry_policy=options.retry,
        cancellation_type=options.cancellation,
        summary=summary,
    )
    return cast(T, result)


async def _local(name: str, arg: Any, result_type: type[T], summary: str, options: Options) -> T:
    local = asyncio.ensure_future(
        workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            schedule_to_close_timeout=options.schedule_to_close,
            start_to_close_timeout=options.start_to_close,
            retry_policy=options.retry,
            cancellation_type=options.cancellation,
            summary=summary,
        )
    )
    try:
        return cast(T, await asyncio.shield(local))
    except asyncio.CancelledError:
        # An interrupt never cuts a local activity off: it would roll back what it was
        # committing (a granted claim, a settlement) and end the busy period "failed:
        # Cancelled". It runs to its end; the drain checks ``stopping`` after every one.
        return cast(T, await local)
