"""``stream_turn``: one provider request, streamed into the store as it arrives.

Promotion happens first (a promoted steer resets the step allowance). Events are appended in
short batches, so watchers see tokens live; a local ``tool.called`` is flushed as soon as the
stream lets go of the event loop and then signalled to the workflow (``tools_ready``), which
starts the tool while the model still streams. Calls that become ready together (parallel calls
in one chunk, or while the previous signal was on its way) share one write and one signal; calls
made durable once the stream has ended are started from the turn's result instead.
The result is a small summary: never the transcript.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio import activity

from activities import compaction, context
from activities.gate import session_rules
from activities.history import (
    DEFAULT_SYSTEM,
    MAX_STEPS_PROMPT,
    current_history,
    prompt_cache_key,
    to_request_messages,
)
from activities.permissions import denies_everything
from activities.providers import base as p
from activities.providers.convert import sendable
from activities.providers.errors import classify
from activities.providers.limits import model_limits
from activities.providers.prices import step_cost
from activities.publisher import StreamProtocolError, TurnPublisher
from activities.restart import ORPHANED_STEP, closing_events
from activities.runtime import HEARTBEAT_SECONDS, Runtime, heartbeating, own, translated
from activities.session import SessionActivities
from activities.tools.base import ToolRegistry
from sessionflow import telemetry
from sessionflow.agents import Agent
from sessionflow.errors import ContextUnavailableError
from sessionflow.models import events as ev
from sessionflow.models.common import CompactionSettings, ModelRef, SessionError, Tokens
from sessionflow.models.drain import (
    CallRef,
    CapacityWait,
    FinishStepInput,
    ToolsReady,
    TurnInput,
    TurnResult,
    workflow_id,
)
from sessionflow.models.journal import hidden_range, visible
from sessionflow.models.messages import AssistantMessage
from sessionflow.models.spend import BudgetReached, token_total
from store import projector
from store.claims import Claim
from store.db import Tx
from store.facade import TurnView
from store.governor import Grant, Wait
from store.sessions import Pending, SessionInfo, StepBasis, TurnSnapshot

log = logging.getLogger(__name__)
T = TypeVar("T")
SHUT_DOWN = SessionError(type="aborted", message="Step interrupted: its worker shut down")


class _CompactFirst(Exception):
    """The request would not fit: roll the turn's opening back and compact first."""


class _OverBudget(Exception):
    """The session's spend reached its budget: roll the opening back, ask nothing."""

    def __init__(self, reached: BudgetReached) -> None:
        super().__init__(reached.describe())
        self.reached = reached


def closes_key_for(result: TurnResult, backoff_ms: int) -> int | None:
    """How long a turn's answer holds back every session of its provider key (ms), or None:
    a 429, a 529 (overloaded) or any error with a ``Retry-After``, for that long, else for
    the drain's own backoff."""
    error = result.raw_error
    if error is None:
        return None
    pushed_back = error.type == "provider.rate-limit" or error.status == 529
    if pushed_back or result.retry_after_ms:
        return result.retry_after_ms or backoff_ms
    return None


def _settles_itself(result: TurnResult) -> bool:
    """Does the step end with its turn? Not when tools are to run, nor when the workflow has
    more to do first: a retry, a compaction, a lost turn."""
    pending = result.calls or result.retryable or result.overflow or result.compact
    return not pending and result.lost is None


@dataclass(frozen=True)
class _Begun:
    """An attempt as its opening transaction left it."""

    session: SessionInfo
    step: int
    index: int
    baseline: str
    agent: Agent
    model: ModelRef
    provider: p.Provider
    basis: StepBasis  # what the turn's step starts on, as the opening left it


class TurnActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.settler = SessionActivities(runtime)

    @activity.defn
    async def stream_turn(self, request: TurnInput) -> TurnResult:
        store = self.rt.store
        claim = await own(store, request.claim)
        async with translated(), heartbeating(store, request.claim):
            try:
                begun = await self._begin(claim, request)
            except _CompactFirst:
                # Rolled back: nothing written, nothing promoted. The workflow compacts first.
                return TurnResult(
                    assistant_message_id=request.assistant_message_id,
                    step=request.step,
                    compact=True,
                )
            except _OverBudget as stop:
                # Rolled back as well: what waits stays pending for when the budget is raised.
                return TurnResult(
                    assistant_message_id=request.assistant_message_id,
                    step=request.step,
                    budget=stop.reached,
                )
            session, step, index, baseline = begun.session, begun.step, begun.index, begun.baseline
            agent, model = begun.agent, begun.model
            last_step = request.max_steps is not None and step >= request.max_steps
            tools = await self.rt.tools_for(session)
            hidden = self._hidden(session, agent, tools)
            provider_request = await self._request(
                claim, session, model, index, last_step, baseline, agent, tools, hidden
            )
            publisher = TurnPublisher(
                session_id=claim.session_id,
                assistant_message_id=request.assistant_message_id,
                agent=agent.name,
                model=model,
                attempt=request.retry + 1,
            )
            taken = await self._take_capacity(claim.session_id, model, provider_request)
            if isinstance(taken, CapacityWait):
                return TurnResult(
                    assistant_message_id=request.assistant_message_id,
                    step=request.step,
                    capacity=taken,
                )
            if request.retry > 0:
                publisher.start_assistant()  # a retry re-announces the same assistant message
            stream = _Stream(self.rt, claim, request, publisher, last_step, hidden)
            stream.provider = begun.provider
            stream.view.basis = begun.basis
            attributes: dict[str, str | int] = {
                "session.id": claim.session_id,
                "model": str(model),
                "step": step,
                # The GenAI semantic conventions' request attributes.
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": model.provider_id,
                "gen_ai.request.model": model.id,
                "gen_ai.conversation.id": claim.session_id,
            }
            with telemetry.tracer().start_as_current_span(
                "provider.turn", attributes=attributes
            ) as span:
                try:
                    ran = await _unless_shutdown(stream.run(provider_request, step))
                    result = ran if ran is not None else stream.handed_back(step)
                    if taken is not None:  # closed while it holds its slot: nobody slips in
                        await self._closed_by(taken, result)
                finally:
                    if taken is not None:
                        await self._give_back(taken, stream.publisher.tokens)
                span.set_attributes(_usage_attributes(result))
            if ran is not None and _settles_itself(result):
                result = await self._settle(request, result)
            return result

    async def _take_capacity(
        self, session_id: str, model: ModelRef, provider_request: p.ProviderRequest
    ) -> Grant | CapacityWait | None:
        """Capacity on the model's provider key for this request (``store/governor.py``); a
        wait when there is none; None for a model with no provider key (scripted)."""
        key = self.rt.capacity.key(model)
        if key is None:
            return None
        estimate = len(provider_request.model_dump_json()) // 4  # tokens, roughly
        taken = await self.rt.store.governor.take(
            key, session_id, estimate, self.rt.capacity.limits_for(model)
        )
        if isinstance(taken, Wait):
            wait_ms = max(50, min(taken.wait_ms, 60_000))  # asked again at least every minute
            until, reason = taken.until_ms, taken.reason
            return CapacityWait(key=key, wait_ms=wait_ms, until_ms=until, reason=reason)
        return taken

    async def _give_back(self, grant: Grant, tokens: Tokens | None) -> None:
        used = None if tokens is None else token_total(tokens)
        with contextlib.suppress(Exception):  # its slot frees itself later if this fails
            await self.rt.store.governor.give_back(grant, used)

    async def _closed_by(self, grant: Grant, result: TurnResult) -> None:
        """A rate-limit answer holds back every session of the key, not only this one."""
        wait = closes_key_for(result, self.rt.retry_backoff_ms)
        if wait is not None:
            await self.rt.store.governor.close(grant.key, wait)

    async def _settle(self, request: TurnInput, result: TurnResult) -> TurnResult:
        """End a step that made no local calls as the workflow's ``finish_step`` would, under
        this turn's own attempt: one local activity fewer per user turn. Any failure leaves the
        settlement to the workflow (``finish_step`` retries it; settling twice writes once)."""
        settle = FinishStepInput(claim=request.claim, attempt=request.attempt, turn=result)
        try:
            settled = await self.settler.settle_step(settle)
        except Exception as error:
            log.warning("The turn left its step to the workflow to settle: %s", error)
            return result
        return result.model_copy(update={"settled": settled})

    async def _would_overflow(
        self, tx: Tx | None, session: SessionInfo, request: TurnInput
    ) -> bool:
        """Would the next request exceed the window (less its output and buffer)? Read in the
        turn's opening transaction when it holds one."""
        store = self.rt.store
        settings = CompactionSettings.model_validate(session.settings.get("compaction") or {})
        if not settings.auto or session.model is None:
            return False
        limits = model_limits(session.model)
        if limits is None:
            return False
        messages = await store.sessions.messages(session.id, tx=tx)
        history = current_history(visible(messages, session.settings))
        added = ""
        if request.promotion is not None:  # what the promotion is about to add, at most
            pending = await store.inputs.pending(session.id, tx=tx)
            added = "\n".join(r.prompt.text for r in pending if r.prompt is not None)
        system = session.settings.get("system") or DEFAULT_SYSTEM
        specs = json.dumps([spec.model_dump() for spec in self.rt.tools.specs()])
        overhead = compaction.tokens(system) + compaction.tokens(specs)
        size = compaction.estimate(history, session.model, added, overhead)
        return compaction.over_limit(size, limits, settings)

    async def _begin(self, claim: Claim, request: TurnInput) -> _Begun:
        """Open the attempt: open the provider (a script that does not load fails here, and
        nothing is promoted and no turn used), promote what is pending, reconcile the context
        baseline, record that a model call is in flight, count the request. The step is 1
        when a prompt was promoted.

        The store (``Store.begin_turn``) opens the usual turn (nothing to promote, the context
        unchanged) from a read outside any transaction where it can (``at_once``), else in
        one fenced transaction (``begin``), run again from the start after a serialization
        failure or a deadlock (C6): every run reads the session, opens its provider (opening
        only loads what it needs, so again is harmless) and computes step, baseline and index
        afresh."""
        store = self.rt.store

        async def at_once(snapshot: TurnSnapshot) -> Callable[[int], _Begun] | None:
            if _promotes(request, snapshot.pending) or _orphan(snapshot.basis) is not None:
                return None
            session = snapshot.session
            agent, model, provider = await self._open(session, request)
            baseline, noted = self._reconciled(session)
            if noted:
                return None
            return lambda index: _Begun(
                session, request.step, index, baseline, agent, model, provider, snapshot.basis
            )

        async def begin(tx: Tx) -> _Begun:
            step = request.step
            session, pending, basis = await store.sessions.opening(
                tx, claim.session_id, request.assistant_message_id
            )
            agent, model, provider = await self._open(session, request, tx)
            orphan = _orphan(basis)
            if orphan is not None:
                await self._close_orphan(tx, claim, orphan)
            # Context changes come before what is promoted now: they happened before it.
            baseline, noted = self._reconciled(session)
            if noted:
                await store.events.publish_many(noted, tx=tx)
            # Only what the opening read says waits (nothing is promoted behind a compaction).
            if request.promotion is not None and not pending.compaction:
                if _promotes(request, pending):
                    await _commit_revert(store, session, tx)
                promoted = 0
                if request.promotion == "queue" and pending.queue:
                    promoted += int(await store.inputs.promote_next_queued(tx, claim.session_id))
                if pending.steer:
                    promoted += await store.inputs.promote_steers(tx, claim.session_id)
                if promoted:
                    step = 1
            index = await store.sessions.count_request(tx, claim.session_id)
            basis = basis.after(tx, claim.session_id)
            return _Begun(session, step, index, baseline, agent, model, provider, basis)

        # A model call is in flight: a takeover must treat the step's outcome as unknown. The
        # fence records it, with everything the opening writes.
        begun: _Begun = await store.begin_turn(
            claim,
            request.assistant_message_id,
            prepare=at_once,
            begin=begin,
            step_attempt=request.attempt,
            phase=("unknown", request.assistant_message_id),
        )
        return begun

    async def _close_orphan(self, tx: Tx, claim: Claim, message_id: str) -> None:
        """End the step of ``message_id`` if a run of this very execution that no longer owns
        the claim started it and never ended it (a Reset's old run, whose stream the new owner
        fenced out): its one terminal, written before the new step's start would complete its
        message silently. A step of another execution is left as the reference leaves it (a
        dead execution's own is closed by its recovery)."""
        store = self.rt.store
        message = await projector.load_message(tx, claim.session_id, message_id)
        if not isinstance(message, AssistantMessage):
            return
        started = await store.events.first_of(
            claim.session_id, [ev.StepStarted], after=message.seq - 1, tx=tx
        )
        if started is None or started.execution_id != claim.execution_id:
            return
        closing = await closing_events(store, message, ORPHANED_STEP, tx)
        await store.events.publish_many(closing, tx=tx)

    async def _open(
        self, session: SessionInfo, request: TurnInput, tx: Tx | None = None
    ) -> tuple[Agent, ModelRef, p.Provider]:
        """The attempt's agent, model and provider (a script that does not load fails here,
        before anything is written), unless the request would not fit (``_CompactFirst``).
        What it reads, it reads in ``tx`` when the opening holds one."""
        if session.model is None:
            raise ValueError(f"Session {session.id} has no model; select one first")
        # At a step boundary only: a retry of a step continues the turn already in flight.
        if request.retry == 0 and session.budget is not None:
            reached = session.budget.reached(session.spend)
            if reached is not None:
                raise _OverBudget(reached)
        # Sampled once per attempt: a selection changing meanwhile applies to the next.
        agent = self.rt.agents.get(session.agent)
        model = ModelRef.parse(agent.model) if agent.model else session.model
        provider = p.open_provider(self.rt.providers(model))
        if not request.skip_compaction and await self._would_overflow(tx, session, request):
            raise _CompactFirst()
        return agent, model, provider

    def _reconciled(self, session: SessionInfo) -> tuple[str, list[ev.Event]]:
        """The frozen system context, and the events that note its changes (its sources'
        changes become system messages)."""
        entries = session.settings.get("context") or {}
        now: dict[str, str] | None
        try:
            if self.rt.runs_tools_of(session):
                settings = context.tool_settings(self.rt.tools)
                now = context.sources(session.directory, entries, settings)
            else:  # the workspace is on another host: as that host last read it
                now = context.observed_sources(session.settings.get("observed"), entries)
        except context.Unobservable as unseen:
            now, why = None, str(unseen)
        first = session.requests == 0
        try:
            baseline, events = context.reconcile(session.id, session.settings, now, first=first)
        except context.Unobservable:
            raise ContextUnavailableError(session.id, session.directory, why) from None
        return baseline, events

    def _hidden(self, session: SessionInfo, agent: Agent, tools: ToolRegistry) -> frozenset[str]:
        """Tools the agent does not offer, or whose every call its rules deny."""
        rules = session_rules(session, agent.permissions)
        return frozenset(
            name
            for name in tools.names()
            if not agent.offers(name) or denies_everything(rules, name)
        )

    async def _request(
        self,
        claim: Claim,
        session: SessionInfo,
        model: ModelRef,
        index: int,
        last_step: bool,
        baseline: str,
        agent: Agent,
        tools: ToolRegistry,
        hidden: frozenset[str],
    ) -> p.ProviderRequest:
        messages = to_request_messages(
            current_history(
                visible(await self.rt.store.sessions.messages(claim.session_id), session.settings)
            ),
            model,
        )
        if last_step:
            messages.append(
                p.RequestMessage(role="assistant", content=(p.TextPartIn(text=MAX_STEPS_PROMPT),))
            )
        # Built here, not from history: it needs the same care with lone surrogates.
        system = sendable(session.settings.get("system") or agent.system or DEFAULT_SYSTEM)
        specs = tuple(spec for spec in tools.specs() if spec.name not in hidden)
        return p.ProviderRequest(
            session_id=claim.session_id,
            request_index=index,
            model=model,
            system=tuple(part for part in (system, baseline) if part),
            messages=tuple(messages),
            tools=() if last_step else specs,
            tool_choice="none" if last_step else None,
            prompt_cache_key=prompt_cache_key(claim.session_id),
        )


async def _commit_revert(store: Any, session: SessionInfo, tx: Tx) -> None:
    """A prompt after a revert makes it permanent: the messages it hid are dropped from
    history (reference: a revert is committed by the next prompt), in the opening's write."""
    hidden = hidden_range(session.settings)
    revert = session.settings.get("revert")
    if hidden is not None and isinstance(revert, dict):
        committed = ev.RevertCommitted(
            session_id=session.id,
            message_id=str(revert.get("message_id")),
            boundary_seq=hidden[0],
        )
        await store.events.publish(committed, tx=tx)


def _orphan(basis: StepBasis) -> str | None:
    """The step a new step would leave without a terminal: the latest assistant message, never
    completed, when this step's own message does not exist yet (a retry re-announces its own).
    Only a run that lost the claim leaves one (a Reset's old run: its attempts' message ids are
    drawn again by the new run): every other loss is closed by the recovery (``restart``)."""
    return None if basis.exists else projector.superseded(basis.latest)


def _promotes(request: TurnInput, pending: Pending) -> bool:
    """Whether the opening promotes what waits (nothing is promoted behind a compaction)."""
    if request.promotion is None or pending.compaction:
        return False
    return pending.steer or (request.promotion == "queue" and pending.queue)


def _overflow(event: p.StreamEvent, publisher: TurnPublisher) -> bool:
    """A provider-error event saying the request did not fit, before any output."""
    return (
        isinstance(event, p.ProviderErrorEvent)
        and not publisher.retry_evidence
        and classify(None, event.message) == "context_overflow"
    )


async def _unless_shutdown(work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or None when the worker began shutting down first.

    A deploy must not wait for a whole stream (nor fail it once the grace period is over):
    ``work`` is cancelled, which flushes what it streamed, and the turn is handed back.
    """
    task = asyncio.ensure_future(work)
    shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        await asyncio.wait((task, shutdown), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    finally:
        shutdown.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


class _Stream:
    """One attempt's stream: publishing in batches, signalling local calls once durable.

    Only the courier task writes while the stream runs: the stream hands it events (through
    the publisher) and ready calls, and it flushes and signals in the order they were made.
    """

    def __init__(
        self,
        rt: Runtime,
        claim: Claim,
        request: TurnInput,
        publisher: TurnPublisher,
        last_step: bool,
        hidden: frozenset[str] = frozenset(),
    ) -> None:
        self.rt, self.claim, self.request, self.publisher = rt, claim, request, publisher
        self.last_step, self.hidden = last_step, hidden
        self.began = time.monotonic()
        # Nothing of this stream is flushed yet: its first event goes at once (the batch
        # interval paces the flushes after it), so a turn's first tokens are never held back.
        self.last_flush = -math.inf
        self.calls: list[CallRef] = []
        self.ready: list[CallRef] = []
        self.kick = asyncio.Event()  # something waits to be flushed
        self.urgent = asyncio.Event()  # ... and cannot wait for the batch interval
        self.closing = False
        self.store_failed = False
        self.signalling: asyncio.Task[None] | None = None
        self.provider: p.Provider | None = None  # opened by the attempt's first transaction
        # The assistant message as this stream's flushes left it (``Store.append``'s view).
        self.view = TurnView(request.assistant_message_id)

    async def run(self, provider_request: p.ProviderRequest, step: int) -> TurnResult:
        publisher = self.publisher
        raw: p.ProviderError | None = None
        courier = asyncio.create_task(self._courier())
        try:
            try:
                provider = self.provider or self.rt.providers(provider_request.model)
                async for event in provider.stream(provider_request):
                    if courier.done():
                        break  # it failed (a lost claim): its error is raised below
                    if _overflow(event, publisher):
                        # Held back (reference §4.5 step 13): compaction may still recover it.
                        assert isinstance(event, p.ProviderErrorEvent)
                        raw = p.ProviderError("context_overflow", event.message)
                        break
                    ready = [call for call in publisher.handle(event) if self._available(call)]
                    if ready:
                        self.ready += ready
                        self.urgent.set()
                    self.kick.set()
            except p.ProviderError as error:
                raw = error
            except StreamProtocolError as error:
                publisher.fail_assistant(
                    SessionError(type="provider.invalid-output", message=str(error))
                )
            await self._stop(courier)  # raises what failed it
        except BaseException:
            self._cancel_signals()
            # Interrupted, or the stream broke (the adapter raised, the store failed): what the
            # stream published stays, partial text included, in order -- unless the store is
            # what failed, and then the lost turn is closed from what it holds.
            await asyncio.shield(self._stop(courier, quiet=True))
            publisher.flush()
            if not self.store_failed:
                with contextlib.suppress(Exception):  # the error raised below explains
                    await asyncio.shield(self.flush())
            raise
        finally:
            courier.cancel()  # only still running after an unexpected error
        self._cancel_signals()
        return await self._summarize(raw, step)

    async def _courier(self) -> None:
        """Flush what the stream published, then signal the calls that flush made durable.

        Only while the stream runs: once it has ended, the turn's result (which lists every
        call) reaches the workflow as soon as a signal would, and starts the rest.
        """
        while True:
            await self.kick.wait()
            await self._batch()
            if self.closing:
                return  # what is left goes with the turn's last flush
            self.kick.clear()
            self.urgent.clear()
            ready, self.ready = self.ready, []
            await self.flush()
            if ready and not self.closing:
                self._send(ready)

    async def _batch(self) -> None:
        """Tokens wait at most one batch interval after the last flush, whatever the provider
        does next (a pause must not hold back what came before it); a ready call not at all."""
        remaining = self.rt.batch_ms / 1000 - (time.monotonic() - self.last_flush)
        if remaining > 0 and not self.urgent.is_set():
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that
            # arrives as its awaitable completes (the courier would then never stop).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.urgent.wait()

    async def _stop(self, courier: asyncio.Task[None], *, quiet: bool = False) -> None:
        """Let the courier finish the flush it is in, then stop it."""
        self.closing = True
        self.kick.set()
        self.urgent.set()
        if quiet:
            await asyncio.gather(courier, return_exceptions=True)
        else:
            await courier

    def _available(self, call: CallRef) -> bool:
        if not self.last_step and call.name not in self.hidden:
            self.calls.append(call)
            return True
        message = f"Tool is not available for this request: {call.name}"
        if self.last_step:
            message += (
                f" (the step limit was reached: max_steps={self.request.max_steps}; tools are "
                f"disabled until the next prompt)"
            )
        error = SessionError(type="tool.execution", message=message)
        self.publisher.queue.append(
            ev.ToolFailed(
                session_id=self.claim.session_id,
                assistant_message_id=self.request.assistant_message_id,
                call_id=call.call_id,
                error=error,
            )
        )
        return False

    async def _summarize(self, raw: p.ProviderError | None, step: int) -> TurnResult:
        publisher = self.publisher
        retryable = False
        if raw is not None:
            retryable = raw.retryable and not publisher.retry_evidence
            if retryable:
                publisher.start_assistant()
                publisher.flush()
            else:
                publisher.fail_assistant(raw.session_error())
        else:
            publisher.flush()
        await self.flush()
        overflow = raw is not None and raw.kind == "context_overflow"
        return TurnResult(
            assistant_message_id=self.request.assistant_message_id,
            step=step,
            overflow=overflow and not publisher.retry_evidence,
            started=publisher.step_started,
            finish=publisher.finish,
            tokens=publisher.tokens,
            cost=step_cost(publisher.model, publisher.tokens),
            calls=tuple(self.calls),
            step_failure=None if retryable else publisher.step_failure,
            provider_failed=publisher.provider_failed,
            raw_error=raw.session_error() if raw is not None else None,
            retryable=retryable,
            retry_after_ms=raw.retry_after_ms if raw is not None else None,
            retry_evidence=publisher.retry_evidence,
        )

    async def flush(self) -> None:
        events = self.publisher.take()
        self.last_flush = time.monotonic()
        if not events:
            return
        try:
            await self.rt.store.append(
                self.claim, events, step_attempt=self.request.attempt, view=self.view
            )
        except Exception:
            self.store_failed = True
            raise
        if time.monotonic() - self.began >= HEARTBEAT_SECONDS:
            # A heartbeat per batch while a long stream runs; a short turn is left to the
            # heartbeat task (its first heartbeat is a server round trip it does not need).
            activity.heartbeat()

    def handed_back(self, step: int) -> TurnResult:
        """The turn as a shutting-down worker leaves it: flushed, its durable calls listed."""
        return TurnResult(
            assistant_message_id=self.request.assistant_message_id,
            step=step,
            started=self.publisher.step_started,
            calls=tuple(self.calls),
            retry_evidence=True,
            lost=SHUT_DOWN,
        )

    def _send(self, calls: list[CallRef]) -> None:
        """Signal in the background, one signal after another: the courier keeps flushing
        tokens while a signal's RPC retries."""
        self.signalling = asyncio.create_task(self._signal_after(self.signalling, calls))

    async def _signal_after(
        self, previous: asyncio.Task[None] | None, calls: list[CallRef]
    ) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        try:
            await self._signal(calls)
        except Exception as error:
            # Not fatal: the turn's result lists every call, and the workflow starts the rest.
            names = ", ".join(call.call_id for call in calls)
            log.warning("tools_ready for %s failed (the turn result starts them): %s", names, error)

    def _cancel_signals(self) -> None:
        """Once the stream has ended its result reaches the workflow as soon as a signal would."""
        if self.signalling is not None:
            self.signalling.cancel()

    async def _signal(self, calls: list[CallRef]) -> None:
        info = activity.info()
        handle = activity.client().get_workflow_handle(
            workflow_id(self.claim.session_id), run_id=info.workflow_run_id
        )
        ready = ToolsReady(
            assistant_message_id=self.request.assistant_message_id, calls=tuple(calls)
        )
        await handle.signal("tools_ready", ready)


def _usage_attributes(result: TurnResult) -> dict[str, str | int | float | Sequence[str]]:
    """What a turn's span says it used, in the GenAI semantic conventions' terms (input
    includes cache reads and writes, output includes reasoning) and ours (``cost``, absent
    when the model has no price)."""
    found: dict[str, str | int | float | Sequence[str]] = {
        "finish": result.finish or "none",
        "tool_calls": len(result.calls),
    }
    if result.finish is not None:
        found["gen_ai.response.finish_reasons"] = (result.finish,)
    tokens = result.tokens
    if tokens is not None:
        found |= {
            "gen_ai.usage.input_tokens": tokens.input + tokens.cache.read + tokens.cache.write,
            "gen_ai.usage.output_tokens": tokens.output + tokens.reasoning,
            "gen_ai.usage.cache_read.input_tokens": tokens.cache.read,
            "gen_ai.usage.cache_creation.input_tokens": tokens.cache.write,
            "gen_ai.usage.reasoning.output_tokens": tokens.reasoning,
        }
    if result.cost is not None:
        found["cost"] = result.cost
    return found
