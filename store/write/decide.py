"""Decide, then write: the pattern behind every write that depends on what it read.

A write of this kind reads something (a message, a tool part), decides from it what to write,
and must not land if what it read moved meanwhile. It has two forms:

- **at once**: the read outside any transaction, with a version (the claim row's, or the
  part's own state), and the decision written by one statement that applies only if that
  version still holds; PostgreSQL only, where it saves a transaction's round trips;
- **fenced**: the read and the write in one fenced transaction (``Claims.run_fenced``), run
  again whole after a conflict; every database.

The caller hands over the pure decision function and nothing else: the store tries the first
form where it applies and falls back to the second when it does not or when the version moved,
and the decision is made afresh from what the second form reads. No caller chooses a path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sessionflow.models.events import Event
from store.claims import Phase
from store.inputs import Waiting

R = TypeVar("R")
S = TypeVar("S")


@dataclass(frozen=True)
class Decision(Generic[R]):
    """A decided write, as a value: the answer the decision gives (``result``), the events it
    appends (each with a fixed id when given as ``(event, id)``), the phase recorded with them
    for ``phase_of`` (None: none), how long the claim must at least live (``hold_until``,
    epoch ms), the step (an assistant message id) whose waiting calls held the claim and which,
    once none of them waits, puts it back on its ordinary lease (``lease_after``), and whether
    the answer also wants what waits to be promoted (``wants_waiting``, read in the same
    write)."""

    result: R
    events: Sequence[Event | tuple[Event, str]] = ()
    phase: Phase | None = None
    phase_of: str | None = None
    hold_until: int | None = None
    lease_after: str | None = None
    wants_waiting: bool = False

    @property
    def writes(self) -> bool:
        return bool(self.events) or self.phase is not None or self.lease_after is not None


@dataclass(frozen=True)
class Written(Generic[R]):
    """What a decided write answers: the decision's result, and what waits to be promoted
    when the decision asked for it."""

    result: R
    waiting: Waiting | None = None


async def decide_then_write(
    decide: Callable[[S], Decision[R]],
    *,
    at_once: Callable[[Callable[[S], Decision[R]]], Awaitable[Written[R] | None]] | None,
    fenced: Callable[[Callable[[Any], Awaitable[Written[R]]]], Awaitable[Written[R]]],
    read: Callable[[Any], Awaitable[S]],
    write: Callable[[Any, Decision[R]], Awaitable[Waiting | None]],
) -> Written[R]:
    """``decide`` written at once when ``at_once`` applies (it returns None, having written
    nothing, when it does not or when what it read moved), else read, decided and written in
    one ``fenced`` transaction: ``fenced(work)`` runs ``work(tx)`` under the claim's fence."""
    if at_once is not None:
        written = await at_once(decide)
        if written is not None:
            return written

    async def work(tx: Any) -> Written[R]:
        decision = decide(await read(tx))
        waiting = await write(tx, decision) if decision.writes else None
        return Written(decision.result, waiting)

    return await fenced(work)
