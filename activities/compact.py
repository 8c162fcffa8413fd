"""``compact``: one compaction step, streamed into the store like a turn (DESIGN "Compaction").

It selects the head of the history to summarize, streams the summary (watchers see it being
written), and writes the compaction message -- which settles a manual compaction's input and
releases the barrier -- in one fenced transaction. It is idempotent per compaction id: a retried
or recovered compaction finds the message its predecessor wrote. An automatic compaction that
fails writes nothing but its deltas; a manual one that fails publishes ``compaction.failed``.
"""

from __future__ import annotations

import time

from temporalio import activity

from activities import compaction as c
from activities.history import current_history
from activities.providers import base as p
from activities.providers.limits import model_limits
from activities.runtime import Runtime, heartbeating, own, translated
from activities.tools.todo import render as render_todos
from sessionflow.models import events as ev
from sessionflow.models.common import CompactionSettings, Limits, ModelRef, SessionError
from sessionflow.models.drain import CompactInput, CompactResult
from sessionflow.models.journal import visible
from sessionflow.models.messages import CompactionMessage
from store.claims import Claim
from store.projector import load_message
from store.sessions import SessionInfo

EMPTY = SessionError(type="compaction.failed", message="The summary call returned no text")


class CompactionActivities:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    @activity.defn
    async def compact(self, request: CompactInput) -> CompactResult:
        store = self.rt.store
        claim = await own(store, request.claim)
        async with translated(), heartbeating(store, request.claim):
            done = await self._settled(claim, request)
            if done is not None:
                return done
            session = await store.sessions.get(claim.session_id)
            assert session.model is not None
            return await self._run(claim, request, session, session.model)

    async def _settled(self, claim: Claim, request: CompactInput) -> CompactResult | None:
        """What an earlier attempt of this compaction already decided, if anything."""
        message = await self.rt.store.claims.run_fenced(
            claim,
            lambda tx: load_message(tx, claim.session_id, request.compaction_id),
            step_attempt=request.attempt,
        )
        if not isinstance(message, CompactionMessage):
            return None
        if message.status == "completed":
            return CompactResult(outcome="compacted")
        return CompactResult(outcome="failed") if message.status == "failed" else None

    async def _run(
        self, claim: Claim, request: CompactInput, session: SessionInfo, model: ModelRef
    ) -> CompactResult:
        settings = CompactionSettings.model_validate(session.settings.get("compaction") or {})
        limits = model_limits(model)
        messages = await self.rt.store.sessions.messages(claim.session_id)
        history = current_history(visible(messages, session.settings))
        previous, head, tail = c.split(history, model, c.keep_tokens(limits, settings))
        if not head:
            return await self._not_compacted(claim, request, "nothing to summarize")
        prompt = c.summary_prompt(previous, c.render(head, model))
        if not c.fits(prompt, limits):
            return await self._not_compacted(claim, request, "the summary request would not fit")
        await self._publish(claim, request, self._event(request, ev.CompactionStarted), "started")
        summarizer = ModelRef.parse(settings.model) if settings.model else model
        summary, error = await self._summarize(claim, request, summarizer, prompt, limits)
        if error is not None or not summary.strip():
            return await self._failed(claim, request, error or EMPTY)
        ended = ev.CompactionEnded(
            session_id=claim.session_id,
            input_id=request.compaction_id if request.manual else None,
            compaction_id=request.compaction_id,
            reason="manual" if request.manual else "auto",
            summary=await self._with_todos(claim.session_id, summary.strip()),
            recent=c.render(tail, model),
            through_seq=max(m.seq for m in head + tail),
        )
        await self._publish(claim, request, ended, "ended")
        return CompactResult(outcome="compacted")

    async def _with_todos(self, session_id: str, summary: str) -> str:
        """The summary, then the session's todo list verbatim: the model's plan and its progress
        must not depend on what the summarizer chose to keep."""
        latest = await self.rt.store.events.latest_of(session_id, ev.TodoUpdated)
        if latest is None or not isinstance(latest.data, ev.TodoUpdated) or not latest.data.todos:
            return summary
        return f"{summary}\n\n{render_todos(latest.data.todos)}"

    def _event(self, request: CompactInput, kind: type[ev.CompactionStarted]) -> ev.Event:
        return kind(
            session_id=request.claim.session_id,
            input_id=request.compaction_id if request.manual else None,
            compaction_id=request.compaction_id,
        )

    async def _publish(
        self, claim: Claim, request: CompactInput, event: ev.Event, tag: str
    ) -> None:
        # A fixed id per compaction: a retried attempt records each step of it once.
        event_id = f"evt_{request.compaction_id}_{tag}"
        await self.rt.store.claims.run_fenced(
            claim,
            lambda tx: self.rt.store.events.publish(event, id=event_id, tx=tx),
            step_attempt=request.attempt,
        )

    async def _not_compacted(self, claim: Claim, request: CompactInput, why: str) -> CompactResult:
        """Nothing worth a summary: the drain goes on. A manual request is still answered."""
        if request.manual:
            error = SessionError(type="compaction.failed", message=f"Not compacted: {why}")
            await self._failed(claim, request, error)
        return CompactResult(outcome="not-compacted", error=None)

    async def _failed(
        self, claim: Claim, request: CompactInput, error: SessionError
    ) -> CompactResult:
        if request.manual:  # the barrier is released; queued prompts then run in order
            failed = ev.CompactionFailed(
                session_id=claim.session_id,
                input_id=request.compaction_id,
                compaction_id=request.compaction_id,
                error=error,
            )
            await self._publish(claim, request, failed, "failed")
        return CompactResult(outcome="failed", error=error)

    async def _summarize(
        self,
        claim: Claim,
        request: CompactInput,
        model: ModelRef,
        prompt: str,
        limits: Limits | None,
    ) -> tuple[str, SessionError | None]:
        """Stream the summary call; its text is published as deltas in short batches."""
        store = self.rt.store
        provider = p.open_provider(self.rt.providers(model))  # before the request counts
        index = await store.claims.run_fenced(
            claim,
            lambda tx: store.sessions.count_request(tx, claim.session_id),
            step_attempt=request.attempt,
        )
        provider_request = p.ProviderRequest(
            session_id=claim.session_id,
            request_index=index,
            model=model,
            system=(c.SUMMARY_SYSTEM,),
            messages=(p.RequestMessage(role="user", content=(p.TextPartIn(text=prompt),)),),
            max_output_tokens=c.summary_limit(limits),
        )
        text: list[str] = []
        batch: list[ev.Event] = []
        flushed = time.monotonic()
        try:
            async for event in provider.stream(provider_request):
                if isinstance(event, p.ProviderErrorEvent):
                    return "", SessionError(type="provider.unknown", message=event.message)
                if isinstance(event, p.TextDelta):
                    text.append(event.delta)
                    batch.append(
                        ev.CompactionDelta(
                            session_id=claim.session_id,
                            compaction_id=request.compaction_id,
                            delta=event.delta,
                        )
                    )
                if batch and time.monotonic() - flushed >= self.rt.batch_ms / 1000:
                    await store.append(claim, batch, step_attempt=request.attempt)
                    batch, flushed = [], time.monotonic()
        except p.ProviderError as error:
            return "", error.session_error()
        if batch:
            await store.append(claim, batch, step_attempt=request.attempt)
        return "".join(text), None
