"""The invariants every session's final event log keeps, whatever failed on the way.

- I1: seq is gap-free from the session's first event.
- I2: a tool's terminal event follows its call (or its input) in the same assistant message.
- I3: at most one terminal per (assistant message, call id), none after the step's terminal.
- I4: events written under a claim carry its execution id and epoch; epochs never go back (no
  write of an older execution after a later one began); only admissions are unstamped.
- I5: exactly one terminal per started step, one execution terminal per ``execution.started``.
- I6: one ``tool.called`` per (assistant message, call id); in a final log every call settled.
- I7: one execution per epoch (a takeover always moves the epoch on).
- I8: the log starts with the session's ``session.created``.
- I9: the projections (the session's messages and parts) equal a rebuild from its events
  alone, replayed into a fresh store.
"""

from __future__ import annotations

import tempfile
import uuid
from collections import Counter
from collections.abc import Collection, Sequence
from pathlib import Path

from store import Store, open_store
from store.events import SerializedEvent, StoredEvent

TOOL_TERMINALS = {"session.tool.success", "session.tool.failed"}
STEP_TERMINALS = {"session.step.ended", "session.step.failed"}
EXECUTION_TERMINALS = {
    "session.execution.succeeded",
    "session.execution.failed",
    "session.execution.interrupted",
}
# What clients write outside any busy period: admissions and the session's own settings.
UNSTAMPED = {
    "session.created",
    "session.prompt.admitted",
    "session.compaction.admitted",
    "session.model.selected",
    "session.agent.selected",
    "session.moved",  # between busy periods, as a selection is
    "session.budget.set",  # at any time: it applies at the next step boundary
    "session.context.set",
    "session.context.deleted",
}
# A fork's log up to its first busy period: written under its source's claim, not its own.
FORK_LOG = {"session.message.copied", "session.part.copied", "session.files.changed"}


async def final_log(store: Store, session_id: str) -> list[StoredEvent]:
    events: list[StoredEvent] = []
    after = -1
    while True:
        page = await store.events.read_after(session_id, after, limit=1000)
        events += page.events
        if page.cursor == after:
            return events
        after = page.cursor


def violations(events: Sequence[StoredEvent], *, final: bool = True) -> list[str]:
    """What ``events`` breaks. A log that is not ``final`` (its session is still claimed: a
    test ended mid busy period) may lack the terminals still to come, never have extra ones."""
    found = _gaps(events) + _tools(events) + _stamps(events) + _terminals(events, final)
    return found + _calls(events, final) + _epochs(events) + _first(events)


def assert_clean(events: Sequence[StoredEvent]) -> None:
    found = violations(events)
    assert not found, "\n".join(found)


# In ``allowed``: the test ends with a session still in its busy period (claimed) on purpose.
UNSETTLED = "unsettled"


async def check_store(store: Store, *, allowed: Collection[str] = ()) -> None:
    """Every session in ``store`` keeps the invariants, but those a test breaks on purpose
    (``allowed``, e.g. ``{"I5"}``). Every log is checked as final, a claimed session's too
    (its missing terminals are failures), unless ``allowed`` holds ``UNSETTLED``: then a
    session still claimed may lack the terminals still to come (never have extra ones)."""
    found: list[str] = []
    logs = {}
    for session in await store.sessions.list(limit=100_000):
        final = UNSETTLED not in allowed or await store.claims.current(session.id) is None
        logs[session.id] = await final_log(store, session.id)
        for problem in violations(logs[session.id], final=final):
            if problem.split(":")[0] not in allowed:
                found.append(f"{session.id}: {problem}")
    if "I9" not in allowed:
        found += await _rebuilt(store, logs)
    assert not found, "\n".join(found)


async def _rebuilt(store: Store, logs: dict[str, list[StoredEvent]]) -> list[str]:
    """I9: every session's log replayed into one fresh SQLite store (in memory-backed files,
    where a commit costs no disk flush), and its projections compared with the store's."""
    if not any(logs.values()):
        return []
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as root:
        copy = await open_store(f"sqlite+aiosqlite:///{Path(root) / f'{uuid.uuid4().hex}.db'}")
        try:
            problems = []
            for session_id, log in logs.items():
                await copy.events.replay_all([serialized(e) for e in log])
                if await copy.sessions.messages(session_id) != await store.sessions.messages(
                    session_id
                ):
                    problems.append(f"I9: {session_id}'s messages differ from a rebuild")
            return problems
        finally:
            await copy.close()


def serialized(event: StoredEvent) -> SerializedEvent:
    """A stored event as replay takes it."""
    return SerializedEvent(
        id=event.id,
        type=event.type,
        seq=event.seq,
        aggregate_id=event.aggregate_id,
        data=event.data.model_dump(mode="json"),
        created=event.created,
    )


def _kind(event: StoredEvent) -> str:
    return event.data.type


def _message(event: StoredEvent) -> str | None:
    return getattr(event.data, "assistant_message_id", None)


def _gaps(events: Sequence[StoredEvent]) -> list[str]:
    seqs = [e.seq for e in events]
    if not seqs:
        return []
    expected = list(range(seqs[0], seqs[0] + len(seqs)))
    return [] if seqs == expected else [f"I1: seq has gaps or repeats: {seqs}"]


def _tools(events: Sequence[StoredEvent]) -> list[str]:
    found: list[str] = []
    opened: set[tuple[str | None, str]] = set()
    settled: Counter[tuple[str | None, str]] = Counter()
    ended_steps: set[str | None] = set()
    for event in events:
        kind, message = _kind(event), _message(event)
        if kind == "session.step.started":
            ended_steps.discard(message)  # a retry re-opens its step
        elif kind in STEP_TERMINALS:
            ended_steps.add(message)
        call_id = getattr(event.data, "call_id", None)
        if call_id is None:
            continue
        key = (message, call_id)
        if kind in ("session.tool.called", "session.tool.input.started"):
            opened.add(key)
        elif kind in TOOL_TERMINALS:
            settled[key] += 1
            if key not in opened:
                found.append(f"I2: {kind} at seq {event.seq} for {key} before any call")
            if settled[key] > 1:
                found.append(f"I3: second terminal at seq {event.seq} for {key}")
            if message in ended_steps:
                found.append(f"I3: {kind} at seq {event.seq} after the step of {key} ended")
        elif kind == "session.tool.progress" and settled[key]:
            found.append(f"I3: progress at seq {event.seq} for settled {key}")
    return found


def _stamps(events: Sequence[StoredEvent]) -> list[str]:
    found: list[str] = []
    epoch = 0
    for event in events:
        if event.execution_id is None:
            copied = epoch == 0 and _kind(event) in FORK_LOG  # before any claim of its own
            if _kind(event) not in UNSTAMPED and not copied:
                found.append(f"I4: {_kind(event)} at seq {event.seq} written under no claim")
            continue
        if event.epoch is None or event.epoch < epoch:
            found.append(f"I4: {_kind(event)} at seq {event.seq} of epoch {event.epoch} < {epoch}")
        epoch = max(epoch, event.epoch or 0)
    return found


def _terminals(events: Sequence[StoredEvent], final: bool = True) -> list[str]:
    found: list[str] = []
    steps: Counter[str | None] = Counter()
    started_steps: list[str | None] = []
    executions: Counter[str] = Counter()
    started_executions: list[str] = []
    for event in events:
        kind = _kind(event)
        if kind == "session.step.started" and _message(event) not in started_steps:
            started_steps.append(_message(event))
        elif kind in STEP_TERMINALS:
            steps[_message(event)] += 1
        execution = getattr(event.data, "execution_id", None)
        if kind == "session.execution.started":
            started_executions.append(execution)
        elif kind in EXECUTION_TERMINALS:
            executions[execution] += 1
    wrong = (lambda n: n != 1) if final else (lambda n: n > 1)
    found += [
        f"I5: step {m} has {steps[m]} terminal events" for m in started_steps if wrong(steps[m])
    ]
    found += [
        f"I5: execution {x} has {executions[x]} terminal events"
        for x in started_executions
        if wrong(executions[x])
    ]
    return found


def _calls(events: Sequence[StoredEvent], final: bool) -> list[str]:
    found: list[str] = []
    called: Counter[tuple[str | None, str]] = Counter()
    settled: set[tuple[str | None, str]] = set()
    for event in events:
        call_id = getattr(event.data, "call_id", None)
        if call_id is None:
            continue
        key = (_message(event), call_id)
        if _kind(event) == "session.tool.called":
            called[key] += 1
            if called[key] > 1:
                found.append(f"I6: second tool.called at seq {event.seq} for {key}")
        elif _kind(event) in TOOL_TERMINALS:
            settled.add(key)
    if final:
        found += [f"I6: call {key} never settled" for key in called if key not in settled]
    return found


def _epochs(events: Sequence[StoredEvent]) -> list[str]:
    executions: dict[int, set[str]] = {}
    for event in events:
        if event.execution_id is not None and event.epoch is not None:
            executions.setdefault(event.epoch, set()).add(event.execution_id)
    return [
        f"I7: epoch {epoch} has executions {sorted(ids)}"
        for epoch, ids in sorted(executions.items())
        if len(ids) > 1
    ]


def _first(events: Sequence[StoredEvent]) -> list[str]:
    if not events or _kind(events[0]) == "session.created":
        return []
    return [f"I8: the log starts with {_kind(events[0])} at seq {events[0].seq}"]
