"""Control: prompt (idempotent by input id), resume (long-poll), interrupt, status."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import APIRouter, Body, Query, Response
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from sessionflow.api.deps import Client, SessionId
from sessionflow.api.schemas import Compaction, InterruptBody, PromptRequest, ResumeAnswer
from sessionflow.client import Interruption, SessionStatus
from store.inputs import InputReceipt

router = APIRouter(prefix="/sessions/{session_id}", tags=["control"])


@router.post("/prompt", response_model=InputReceipt)
async def prompt(session_id: SessionId, body: PromptRequest, client: Client) -> InputReceipt:
    """Admit the prompt durably, then wake the session. A repeat of an input id with the same
    content returns the first receipt; different content under it is a 409."""
    return await client.prompt(
        session_id,
        body.prompt(),
        delivery=body.delivery,
        input_id=body.input_id,
        wake=body.wake,
    )


@router.post("/resume", response_model=ResumeAnswer, responses={202: {"model": ResumeAnswer}})
async def resume(
    session_id: SessionId,
    client: Client,
    response: Response,
    # The long-poll's bound is part of the HTTP contract, not a cancellation scope.
    timeout: Annotated[float, Query(gt=0, le=3600, description="seconds to wait")] = 30.0,  # noqa: ASYNC109
) -> ResumeAnswer:
    """Run the session (or join its busy period) and answer with its outcome; if it takes
    longer than ``timeout``, answer 202 ``{"done": false}`` while the work goes on."""
    waiting = asyncio.ensure_future(client.resume(session_id))
    done, _ = await asyncio.wait({waiting}, timeout=timeout)
    try:
        if done:
            return ResumeAnswer(done=True, outcome=waiting.result())
        waiting.cancel()  # only this wait: the busy period goes on
        with contextlib.suppress(asyncio.CancelledError, WorkflowUpdateRPCTimeoutOrCancelledError):
            await waiting
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        pass  # Temporal's own long-poll bound came first
    response.status_code = 202
    return ResumeAnswer(done=False)


@router.post("/interrupt", response_model=Interruption)
async def interrupt(
    session_id: SessionId, client: Client, body: Annotated[InterruptBody | None, Body()] = None
) -> Interruption:
    """``stopped``: this request stopped the busy period; ``idle``: nothing was running;
    ``sent``: no worker answered in time, it takes effect when one does."""
    body = body or InterruptBody()
    return await client.interrupt(session_id, body.reason, request_id=body.request_id)


@router.post("/compact", status_code=202, response_model=Compaction)
async def compact(session_id: SessionId, client: Client) -> Compaction:
    """Compact the history at the next step boundary; prompts admitted after it wait for it."""
    return Compaction(input_id=await client.compact(session_id))


@router.get("/status", response_model=SessionStatus)
async def status(session_id: SessionId, client: Client) -> SessionStatus:
    return await client.status(session_id)
