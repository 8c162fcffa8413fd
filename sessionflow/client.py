"""``SessionClient``: the SDK that users, the CLI and external checks use.

Input is admitted durably in the store first, then the session's drain workflow is woken
(signal-with-start), so a prompt survives workers that are down. Events are read and followed
from the store, never from Temporal.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from sessionflow import telemetry
from sessionflow.agents import Agents, load_agents
from sessionflow.errors import RequestNotWaitingError
from sessionflow.ids import validate_id
from sessionflow.models.common import Delivery, ModelRef, Prompt
from sessionflow.models.drain import (
    SESSION_ID_SEARCH_ATTRIBUTE,
    TASK_QUEUE,
    DrainInput,
    DrainStatus,
    InterruptRequest,
    InterruptResult,
    Outcome,
    ResumeRequest,
    WakeSignal,
    workflow_id,
)
from sessionflow.models.events import AgentSelected
from sessionflow.models.messages import AssistantMessage, Message, ToolPart, ToolRunning
from sessionflow.models.permissions import (
    Decision,
    PermissionReply,
    PermissionRequest,
    RespondResult,
    Rule,
)
from sessionflow.settings import Settings
from store import Store, open_store
from store.events import StoredEvent
from store.inputs import InputReceipt
from store.sessions import SessionInfo

SESSION_ID_ATTRIBUTE = SearchAttributeKey.for_keyword(SESSION_ID_SEARCH_ATTRIBUTE)
WORKFLOW_TYPE = "SessionWorkflow"


@dataclass(frozen=True)
class Interruption:
    """What an interrupt request did. True only when it is known to have stopped the work.

    - ``stopped``: this request stopped the running busy period (its terminal event is
      ``execution.interrupted``);
    - ``idle``: nothing was running, or another request is already stopping it;
    - ``sent``: no worker answered in time. The interrupt is recorded in the workflow and
      takes effect when a worker picks it up, if the session is still busy then.
    """

    status: Literal["stopped", "idle", "sent"]

    def __bool__(self) -> bool:
        return self.status == "stopped"


@dataclass(frozen=True)
class ClientEvent:
    """A stored event as the SDK shows it: unversioned type, fields as a dict."""

    seq: int
    id: str
    type: str
    created: int
    data: dict[str, Any]

    @classmethod
    def of(cls, stored: StoredEvent) -> ClientEvent:
        return cls(
            seq=stored.seq,
            id=stored.id,
            type=stored.data.type,
            created=stored.created,
            data=stored.data.model_dump(mode="json"),
        )


@dataclass(frozen=True)
class SessionStatus:
    session_id: str
    busy: bool
    drain: DrainStatus | None
    pending_inputs: int


class SessionClient:
    def __init__(
        self,
        client: Client,
        store: Store,
        *,
        task_queue: str = TASK_QUEUE,
        agents: Agents | None = None,
    ) -> None:
        self.temporal = client
        self.store = store
        self.task_queue = task_queue
        self.agents = agents or Agents()

    @classmethod
    async def connect(
        cls,
        *,
        temporal_address: str = "127.0.0.1:7233",
        database_url: str | None = None,
        task_queue: str = TASK_QUEUE,
        namespace: str = "default",
        client: Client | None = None,
        store: Store | None = None,
    ) -> SessionClient:
        if client is None:
            client = await Client.connect(
                temporal_address,
                namespace=namespace,
                data_converter=pydantic_data_converter,
                interceptors=telemetry.interceptors(),
            )
        settings = Settings.from_env()
        if store is None:
            store = await open_store(database_url or settings.database_url, settings=settings)
        return cls(client, store, task_queue=task_queue, agents=load_agents(settings.agents_file))

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.store.close()

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        workspace: str,
        model: str | ModelRef,
        max_active_tools: int = 8,
        max_steps: int | None = None,
        system: str | None = None,
        title: str = "",
        session_id: str | None = None,
        agent: str | None = None,
        permissions: Sequence[Rule | dict[str, Any]] = (),
        network: bool = False,
        approval_timeout: float | None = None,
    ) -> str:
        if max_active_tools < 1:
            raise ValueError(f"max_active_tools must be at least 1, got {max_active_tools}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        settings: dict[str, Any] = {"max_active_tools": max_active_tools}
        if max_steps is not None:
            settings["max_steps"] = max_steps
        if system:
            settings["system"] = system
        if agent is not None:
            self.agents.get(agent)  # an unknown name is an error here, at the edge
        rules = [Rule.model_validate(r).model_dump(mode="json") for r in permissions]
        optional = {"permissions": rules, "network": network, "approval_timeout": approval_timeout}
        settings.update({key: value for key, value in optional.items() if value})
        info = await self.store.sessions.create(
            workspace,
            session_id=session_id,
            title=title,
            model=ModelRef.parse(model) if isinstance(model, str) else model,
            settings=settings,
            agent=agent,
        )
        return info.id

    async def session(self, session_id: str) -> SessionInfo:
        return await self.store.sessions.get(session_id)

    async def list_sessions(self, **filters: Any) -> list[SessionInfo]:
        return await self.store.sessions.list(**filters)

    async def messages(self, session_id: str) -> list[Message]:
        await self.store.sessions.get(session_id)  # unknown sessions are an error, not empty
        return await self.store.sessions.messages(session_id)

    # --- control --------------------------------------------------------------------------------

    async def prompt(
        self,
        session_id: str,
        text: str | Prompt,
        *,
        delivery: Delivery = "steer",
        input_id: str | None = None,
        wake: bool = True,
    ) -> InputReceipt:
        """Admit the prompt durably, then wake the session (unless ``wake=False``)."""
        receipt = await self.store.inputs.admit(
            session_id, text, input_id=input_id, delivery=delivery
        )
        if wake:
            await self.wake(session_id, input_id=receipt.id)
        return receipt

    async def wake(self, session_id: str, *, input_id: str | None = None) -> None:
        info = await self.store.sessions.get(session_id)
        await self.temporal.start_workflow(
            WORKFLOW_TYPE,
            DrainInput(session_id=session_id),
            id=workflow_id(session_id),
            task_queue=self.task_queue,
            start_signal="wake",
            start_signal_args=[WakeSignal(input_id=input_id)],
            search_attributes=_attributes(session_id),
            static_summary=_summary(info),
        )

    async def resume(self, session_id: str) -> Outcome:
        """Run the session (force) or join its running busy period; returns its outcome."""
        info = await self.store.sessions.get(session_id)
        operation: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            WORKFLOW_TYPE,
            DrainInput(session_id=session_id),
            id=workflow_id(session_id),
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=_attributes(session_id),
            static_summary=_summary(info),
        )
        outcome = await self.temporal.execute_update_with_start_workflow(
            "resume",
            ResumeRequest(request_id=str(uuid.uuid4())),
            start_workflow_operation=operation,
            result_type=Outcome,
        )
        assert isinstance(outcome, Outcome)
        return outcome

    async def interrupt(
        self, session_id: str, reason: str = "user", *, request_id: str | None = None
    ) -> Interruption:
        """Stop the running busy period; see ``Interruption`` for what the answer means.

        The answer comes from an update (its id is the request id, so a repeat is answered
        once). When no worker answers in time, the interrupt is sent as a durable signal that
        takes effect when a worker is back, and the answer says it was only sent.
        """
        request_id = request_id or f"interrupt-{uuid.uuid4()}"
        request = InterruptRequest(reason=reason, request_id=request_id)
        handle = self._handle(session_id)
        try:
            result = await handle.execute_update(
                "interrupt",
                request,
                id=request_id,
                result_type=InterruptResult,
                rpc_timeout=timedelta(seconds=10),
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            await handle.signal("interrupt", request)
            return Interruption("sent")
        except RPCError as error:
            if error.status == RPCStatusCode.NOT_FOUND:
                return Interruption("idle")  # no open run: nothing to interrupt
            raise
        except Exception as error:
            if "already completed" in str(error):
                return Interruption("idle")
            raise
        return Interruption("stopped" if result.accepted else "idle")

    # --- permissions, questions, agents ---------------------------------------------------------

    async def respond(
        self,
        session_id: str,
        request_id: str,
        decision: Decision,
        message: str | None = None,
        *,
        answer: str | None = None,
        by: str | None = None,
        wait: float = 10.0,
    ) -> RespondResult:
        """Answer a waiting permission ask or question (``once``, ``always``, ``reject``).

        The update's id is the request id, so a repeat is answered once. When no worker answers
        in time (``wait`` seconds) the reply is sent as a durable signal, taken when a worker
        is back (``sent``).
        """
        validate_id(request_id, "request")
        reply = PermissionReply(
            request_id=request_id, decision=decision, message=message, answer=answer, by=by
        )
        handle = self._handle(session_id)
        for _ in range(50):
            try:
                result = await handle.execute_update(
                    "respond",
                    reply,
                    id=request_id,
                    result_type=RespondResult,
                    rpc_timeout=timedelta(seconds=wait),
                )
                assert isinstance(result, RespondResult)
                return result
            except WorkflowUpdateRPCTimeoutOrCancelledError:
                await self._waiting(session_id, request_id)
                await handle.signal("respond", reply)
                return RespondResult(status="sent", request_id=request_id)
            except (WorkflowUpdateFailedError, RPCError):
                # Recorded but not yet waiting (the workflow is a moment behind the store)?
                await self._waiting(session_id, request_id)
                await asyncio.sleep(0.1)
        raise TimeoutError(f"Request {request_id} was not taken: try again")

    async def answer(self, session_id: str, request_id: str, text: str) -> RespondResult:
        """Answer a question the model asked: ``text`` is the question tool's result."""
        return await self.respond(session_id, request_id, "once", answer=text)

    async def waiting(self, session_id: str) -> list[PermissionRequest]:
        """The permission asks and questions waiting for an answer, from the store."""
        return [
            part.state.asked
            for message in await self.messages(session_id)
            if isinstance(message, AssistantMessage)
            for part in message.content
            if isinstance(part, ToolPart)
            and isinstance(part.state, ToolRunning)
            and part.state.asked is not None
        ]

    async def _waiting(self, session_id: str, request_id: str) -> PermissionRequest:
        waiting = await self.waiting(session_id)
        found = next((r for r in waiting if r.request_id == request_id), None)
        if found is None:
            raise RequestNotWaitingError(session_id, request_id, [r.request_id for r in waiting])
        return found

    async def set_agent(self, session_id: str, agent: str) -> None:
        """Select the session's agent; it applies from the next model turn on."""
        self.agents.get(agent)  # an unknown name is an error here, at the edge
        await self.store.sessions.get(session_id)
        await self.store.events.publish(AgentSelected(session_id=session_id, agent=agent))

    async def status(self, session_id: str) -> SessionStatus:
        await self.store.sessions.get(session_id)
        pending = len(await self.store.inputs.pending(session_id))
        drain: DrainStatus | None = None
        try:
            description = await self._handle(session_id).describe()
            if description.status is not None and description.status.name == "RUNNING":
                drain = await self._handle(session_id).query("status", result_type=DrainStatus)
        except RPCError:
            drain = None
        busy = drain is not None and drain.busy
        return SessionStatus(session_id, busy, drain, pending)

    async def wait_idle(self, session_id: str, *, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Wait until no busy period runs (never starts work)."""
        deadline = time.monotonic() + timeout
        while True:
            status = await self.status(session_id)
            if not status.busy and not (status.drain and status.drain.pending_wake):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Session {session_id} still busy after {timeout} s")
            await asyncio.sleep(0.05)

    # --- events ---------------------------------------------------------------------------------

    async def events(
        self, session_id: str, *, after: int = -1, follow: bool = False
    ) -> AsyncIterator[ClientEvent]:
        validate_id(session_id)
        async for item in self.store.events.log(session_id, after=after, follow=follow):
            if isinstance(item, StoredEvent):
                yield ClientEvent.of(item)

    def _handle(self, session_id: str) -> WorkflowHandle[Any, Any]:
        return self.temporal.get_workflow_handle(workflow_id(validate_id(session_id)))


def _summary(info: SessionInfo) -> str:
    """The drain's static summary in the Temporal UI: which session, model and workspace."""
    return f"session {info.id} · {info.model or 'no model'} · {info.directory}"


def _attributes(session_id: str) -> TypedSearchAttributes:
    return TypedSearchAttributes([SearchAttributePair(SESSION_ID_ATTRIBUTE, session_id)])
