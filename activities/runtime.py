"""What activities share: the store, the tools, the providers; and the error translation."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.client import WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.capacity import Capacity
from activities.providers.base import Provider
from activities.providers.registry import environment_settings, make_provider
from activities.tools.base import ToolFailure, ToolRegistry
from activities.tools.mcp import McpPool
from activities.tools.offered import offered_tools
from activities.tools.task import DEFAULT_MAX_DEPTH, Task
from sessionflow.agents import Agents
from sessionflow.errors import (
    ClaimHeldError,
    ClaimLostError,
    SessionflowError,
    StoreUnavailableError,
)
from sessionflow.models.common import ModelRef
from sessionflow.models.drain import LOCAL_HOST, ClaimRef
from store import Store
from store.blobs import Retention
from store.claims import Claim
from store.sessions import SessionInfo

log = logging.getLogger(__name__)
ProviderFactory = Callable[[ModelRef], Provider]
HEARTBEAT_SECONDS = 0.5
OUTAGE_FIRST_PAUSE_S = 0.1
OUTAGE_MAX_PAUSE_S = 2.0
T = TypeVar("T")


def default_providers(model: ModelRef) -> Provider:
    """The adapter for ``model``, configured from the environment (``providers/settings.py``)."""
    try:
        settings = environment_settings()
    except ValueError as error:
        # A bad setting stays bad on every retry: fail the turn with the variable's name.
        raise ApplicationError(
            f"Invalid provider settings: {error}", type="ProviderSettings", non_retryable=True
        ) from error
    provider = make_provider(model, settings)
    if provider is None:
        raise ApplicationError(
            f"Unknown model provider {model.provider_id!r} in {model}: this worker knows "
            "openai/<model> (Responses), openai-chat/<model> (Chat Completions, also for "
            "compatible servers), anthropic/<model> and scripted/<path to script>",
            type="ProviderNotFound",
            non_retryable=True,
        )
    return provider


@dataclass
class Runtime:
    store: Store
    tools: ToolRegistry
    providers: ProviderFactory = default_providers
    turn_timeout_s: int = 3600  # Settings.turn_timeout_s
    claim_wait_s: int = 3600  # Settings.claim_wait_s
    retry_backoff_ms: int = 2000  # Settings.retry_backoff_ms
    batch_ms: int = 30  # Settings.batch_ms
    agents: Agents = field(default_factory=Agents)
    mcp: McpPool | None = None  # the worker's MCP servers (``SESSIONFLOW_MCP``)
    max_depth: int = DEFAULT_MAX_DEPTH  # Settings.max_depth: how deep a session tree grows
    # The host whose tools this worker runs (``SESSIONFLOW_HOST``); None: it runs none.
    host: str | None = LOCAL_HOST
    # The rate governor's keys and limits (``SESSIONFLOW_RATE_LIMITS``).
    capacity: Capacity = field(default_factory=Capacity)
    # How long and how much of the journal's content the recovery sweep keeps.
    retention: Retention = field(default_factory=Retention)

    def __post_init__(self) -> None:
        # Every worker offers ``task`` when its agents include a subagent.
        if self.tools.get(Task.name) is None and self.agents.subagents():
            task = Task(self.agents, max_depth=self.max_depth)
            self.tools = self.tools.merged([("built-in", task)])

    def runs_tools_of(self, session: SessionInfo) -> bool:
        """Whether this worker is of the host that holds ``session``'s workspace."""
        return self.host == session.host

    async def tools_for(self, session: SessionInfo) -> ToolRegistry:
        """What ``session`` may call: the worker's tools, then the tools of the MCP servers
        the session uses. A server that cannot start now offers nothing this time (logged);
        a call of one of its tools says why (``tool_for``). For a session of another host,
        what that host's workers offer (their leases, ``store/hosts.py``)."""
        if not self.runs_tools_of(session):
            return offered_tools(await self.store.hosts.offered(session.host) or [])
        if self.mcp is None:
            return self.tools
        found: list[tuple[str, Any]] = []
        for name in self.mcp.enabled(session.settings.get("mcp")):
            try:
                tools = await self.mcp.tools(name, session.directory)
            except ToolFailure as error:
                log.warning("session %s: %s", session.id, error)
                continue
            for tool in tools:
                if self.tools.get(tool.name) is not None:
                    log.warning("MCP tool %s is hidden by the tool of that name", tool.name)
                    continue
                found.append((f"MCP server {name}", tool))
        return self.tools.merged(found)

    async def tool_for(self, session: SessionInfo, name: str) -> Any | None:
        """The tool ``name`` for ``session``; None when nobody offers it. An MCP server that
        cannot start raises ``ToolFailure`` naming it, for the call to read."""
        tool = self.tools.get(name)
        if tool is not None or self.mcp is None:
            return tool
        for server in self.mcp.enabled(session.settings.get("mcp")):
            if name.startswith(f"{server}_"):
                for candidate in await self.mcp.tools(server, session.directory):
                    if candidate.name == name:
                        return candidate
        return None


def run_owner() -> str | None:
    """The owner this activity writes as: its workflow run (``workflow id/run id``); None
    outside a workflow's activity."""
    if not activity.in_activity():
        return None
    info = activity.info()
    if not info.workflow_id or not info.workflow_run_id:
        return None
    return f"{info.workflow_id}/{info.workflow_run_id}"


def to_claim(ref: ClaimRef) -> Claim:
    """The claim as this activity writes under it: as its own workflow run (``run_owner``),
    whichever run acquired it. The fence holds the owner, so a run's writes land only while it
    owns the claim (``own``)."""
    owner = run_owner()
    if owner is None or not ref.owner_id.startswith(owner.split("/", 1)[0] + "/"):
        owner = ref.owner_id  # not a run of the workflow that acquired it (a test's activity)
    return Claim(ref.session_id, ref.execution_id, owner, ref.epoch, 0, ref.lease_ms)


# Claims this process made (or saw) their activity's run own: (session, execution, epoch, owner).
_OWNED: dict[tuple[str, str, int, str], None] = {}
_OWNED_MAX = 10_000


async def own(store: Store, ref: ClaimRef) -> Claim:
    """``to_claim``, making this activity's run the claim's owner first when another run
    acquired it: a continue-as-new carries a claim into the next run, and an operator's
    Reset replays the old run's history, its claim included, into a new run. The new run owns
    the claim once Temporal says it is the workflow's running one (then every other run is
    closed), and only if no other run took it meanwhile (``Claims.reown``); from then on the
    fence refuses every write of the runs before it, zombie activities included. The
    acquiring run itself, the common case, costs nothing here; a run that carries a claim
    costs a read, one describe and one write, once per worker process."""
    claim = to_claim(ref)
    key = (claim.session_id, claim.execution_id, claim.epoch, claim.owner_id)
    if claim.owner_id == ref.owner_id or key in _OWNED:
        return claim
    seen = await store.claims.owner(claim)
    if seen is not None and seen != claim.owner_id:
        if not await _running_run():
            return claim  # not the running run: its writes are refused, as a zombie's must be
        if not await store.claims.reown(claim, seen):
            return claim  # gone, or another run took it: the write says why it is refused
    if len(_OWNED) >= _OWNED_MAX:
        _OWNED.pop(next(iter(_OWNED)))
    _OWNED[key] = None
    return claim


async def _running_run() -> bool:
    """Whether this activity's workflow run is its workflow's running run, as Temporal says.
    A server that does not answer (three tries) fails the attempt, to be retried: never a
    silent no, which would refuse a live run's writes for good."""
    info = activity.info()
    handle = activity.client().get_workflow_handle(info.workflow_id or "")
    for pause in (0.2, 0.5, None):
        try:
            described = await handle.describe()
        except RPCError as error:
            if pause is None:
                raise ApplicationError(
                    f"Temporal did not say whether run {info.workflow_run_id} runs: {error}",
                    type="RunUnknownError",
                ) from error
            await asyncio.sleep(pause)
            continue
        return is_running_run(described, info.workflow_run_id)
    raise AssertionError("unreachable")


def is_running_run(described: WorkflowExecutionDescription, run_id: str | None) -> bool:
    """Whether ``run_id`` is the running run of the workflow ``described`` (its latest run)."""
    return described.run_id == run_id and described.status == WorkflowExecutionStatus.RUNNING


def to_ref(claim: Claim) -> ClaimRef:
    return ClaimRef(
        session_id=claim.session_id,
        execution_id=claim.execution_id,
        owner_id=claim.owner_id,
        epoch=claim.epoch,
        lease_ms=claim.lease_ms,
    )


def application_error(
    error: SessionflowError, *, claim_wait_s: int | None = None
) -> ApplicationError:
    """Domain errors as Temporal failures: a held claim retries at its expiry, a lost one stops.

    ``claim_wait_s``: the worker's bound on waiting for a held claim, handed to the workflow
    in the failure's details (the workflow holds no settings of its own)."""
    if isinstance(error, ClaimHeldError):
        wait_ms = max(100, error.remaining_ms() + 100)
        return ApplicationError(
            str(error),
            *(() if claim_wait_s is None else (claim_wait_s,)),
            type="ClaimHeldError",
            next_retry_delay=timedelta(milliseconds=wait_ms),
        )
    non_retryable = isinstance(error, ClaimLostError | ValueError)
    return ApplicationError(str(error), type=type(error).__name__, non_retryable=non_retryable)


@asynccontextmanager
async def translated() -> AsyncIterator[None]:
    try:
        yield
    except SessionflowError as error:
        raise application_error(error) from error


@asynccontextmanager
async def heartbeating(store: Store, claim: ClaimRef) -> AsyncIterator[None]:
    """Heartbeat often (cancellation arrives with heartbeats) and renew the claim every lease/3.

    A lost claim cancels the work: the activity then fails with a non-retryable ClaimLostError.
    """
    task = asyncio.current_task()
    lost: list[ClaimLostError] = []

    async def renew() -> None:
        try:
            await store.claims.renew(to_claim(claim))
        except ClaimLostError as error:
            lost.append(error)
            assert task is not None
            task.cancel()
        except Exception as error:
            # A blip (connection reset, a busy database): try again at the next beat; the
            # lease outlasts several renewals, and a lost one is fatal above.
            log.warning("Claim renewal failed, retrying: %s", error)
            raise

    async def beat() -> None:
        """Heartbeats never wait for a renewal: one stuck behind a busy pool or a locked
        claim row must not cost the activity its heartbeat timeout."""
        renew_every = claim.lease_ms / 3000
        last_renew = time.monotonic()
        renewing: asyncio.Task[None] | None = None
        try:
            while not lost:
                await asyncio.sleep(HEARTBEAT_SECONDS)
                activity.heartbeat()
                if renewing is not None and renewing.done():
                    if not renewing.cancelled() and renewing.exception() is None:
                        last_renew = time.monotonic()
                    renewing = None
                due = time.monotonic() - last_renew >= renew_every
                if due and renewing is None:
                    renewing = asyncio.create_task(renew())
        finally:
            if renewing is not None:
                renewing.cancel()

    beater = asyncio.create_task(beat())
    try:
        yield
    except asyncio.CancelledError:
        if lost:
            raise application_error(lost[0]) from None
        raise
    finally:
        beater.cancel()


async def through_outages(work: Callable[[], Awaitable[T]], *, within_ms: int) -> T:
    """``work()``, again after a growing, jittered pause while the database is unavailable,
    for up to ``within_ms`` (the claim's lease: by then the claim may have lapsed, and its
    fence refuses the write anyway).

    For a write that holds what exists nowhere else, a tool's result: Temporal's few quick
    retries of the activity are spent in a second of outage (a restart, a failover), and the
    call would fail or, for a tool that is not retry-safe, settle as outcome-unknown although
    it ran. ``work`` must be idempotent: a write cut off at its commit may have committed.
    """
    deadline = time.monotonic() + within_ms / 1000
    pause = OUTAGE_FIRST_PAUSE_S
    while True:
        try:
            return await work()
        except StoreUnavailableError as error:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("The database is unavailable, retrying in %.1f s: %s", pause, error.reason)
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(2 * pause, OUTAGE_MAX_PAUSE_S)


def describe(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 500 else text[:497] + "..."
