"""The claim: a database lease that mirrors which execution owns a session, and fences the rest.

Invariants (DESIGN "The claim"):

- A live match is the same session, execution id, owner id and epoch with ``expires_at`` after
  the *database* clock. Epochs strictly increase per session across every claim ever taken
  (the last one issued is kept on the session row, which outlives released claims).
- ``renew`` moves ``expires_at`` to db-now + lease (never earlier: a hold stays) only for a
  live match: an expired claim never renews itself; only a new acquisition, with a new epoch,
  revives the session.
- ``run_fenced`` (and ``fenced``) opens a write transaction that renews first (which locks the
  claim row on PostgreSQL; SQLite write transactions are exclusive), so a takeover waits for it
  or it fails with ``ClaimLostError`` and rolls back everything it wrote. ``run_fenced`` runs
  its work again, fence and all, after a serialization failure or a deadlock (C6).
- Lock order is claim row, then event sequence rows (sorted by aggregate id), then session row,
  in every transaction (an event's projections take the session row after its sequence row),
  so none deadlock.
- No wait is unbounded (``db.Waits``): an acquisition waits for the claim row lock at most
  ``claim_lock_ms``, then raises ``ClaimHeldError``; the clock it decides with, and the new
  expiry, are read after the lock, so a takeover that waited never starts out expired.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import sqlalchemy as sa

from sessionflow.errors import (
    CLAIM_RELEASED,
    ClaimHeldError,
    ClaimLostError,
    SessionNotFoundError,
    StaleAttemptError,
)
from sessionflow.ids import validate_id
from store.db import Connection, Database, Stamp, Tx, retry_conflicts
from store.dialect import DRIVER_ERRORS, DialectName, for_update, insert, is_lock_timeout, now_ms
from store.prepared import Prepared
from store.schema import execution_table, recovery_table, session_table, tool_run_table
from store.tool_runs import ToolAttempt, ToolRuns
from store.write.fence import Fence, fence

T = TypeVar("T")
Phase = Literal["ready", "unknown", "continue"]
_x = execution_table.c


class _RowLocked(Exception):
    """The claim row stayed locked past the acquisition's lock timeout."""


@contextmanager
def _lock_bounded() -> Iterator[None]:
    """A lock wait inside that ran past the lock timeout raises ``_RowLocked``."""
    try:
        yield
    except DRIVER_ERRORS as error:
        if is_lock_timeout(error):
            raise _RowLocked from error
        raise


@dataclass(frozen=True)
class Claim:
    session_id: str
    execution_id: str
    owner_id: str
    epoch: int
    expires_at: int
    lease_ms: int
    phase: Phase = "ready"
    step_attempt: int = 0
    assistant_message_id: str | None = None


@dataclass(frozen=True)
class Recovery:
    """A dead execution whose session the next drain must recover."""

    session_id: str
    execution_id: str
    phase: Phase
    continuation_message_id: str | None
    wake_pending: bool
    recovery_error: str | None
    attempts: int
    time_created: int


class Claims:
    def __init__(self, db: Database, *, lease_ms: int = 30_000) -> None:
        self.db = db
        self.lease_ms = lease_ms

    # --- acquire --------------------------------------------------------------------------------

    async def acquire(
        self,
        session_id: str,
        execution_id: str,
        owner_id: str,
        *,
        lease_ms: int | None = None,
        dead: str | None = None,
    ) -> Claim:
        """Claim the session for ``execution_id``.

        A live claim of another execution raises ``ClaimHeldError`` (with its expiry); an expired
        one is taken over in the same transaction, which records a recovery row for the dead
        execution. Acquiring again for the same live execution and owner returns its claim.
        ``dead`` names an execution known to be over though its claim is live (Temporal says
        its run closed): a live claim of exactly that execution is taken over as if expired.
        """

        async def nothing(_claim: Claim, _tx: Tx) -> None:
            return None

        return await self.acquire_with(
            session_id, execution_id, owner_id, nothing, lease_ms=lease_ms, dead=dead
        )

    async def acquire_with(
        self,
        session_id: str,
        execution_id: str,
        owner_id: str,
        work: Callable[[Claim, Tx], Awaitable[object]],
        *,
        lease_ms: int | None = None,
        dead: str | None = None,
    ) -> Claim:
        """``acquiring`` with ``work`` (what the new claim starts) inside, the two run again
        from the start after a serialization failure or a deadlock (catalogue C6), as
        ``run_fenced``'s work is: ``work`` must touch nothing but its tx."""

        async def once() -> Claim:
            async with self.acquiring(
                session_id, execution_id, owner_id, lease_ms=lease_ms, dead=dead
            ) as (claim, tx):
                await work(claim, tx)
                return claim

        return await retry_conflicts(once)

    @asynccontextmanager
    async def acquiring(
        self,
        session_id: str,
        execution_id: str,
        owner_id: str,
        *,
        lease_ms: int | None = None,
        dead: str | None = None,
    ) -> AsyncIterator[tuple[Claim, Tx]]:
        """``acquire``, with the transaction left open for what the new claim starts.

        Whatever is written inside commits with the claim (or not at all) and is stamped with
        it, as in ``fenced``: one transaction, one commit, instead of two. The session row's
        epoch is written last, after those writes: on PostgreSQL an event takes its sequence
        row before its projections take the session row, in every transaction (an admission
        does exactly that), so taking the session row first here could deadlock with one.
        """
        validate_id(session_id)
        validate_id(execution_id, "execution")
        lease = lease_ms or self.lease_ms
        try:
            async with self.db.write() as tx:
                claim = await self._acquire(tx, session_id, execution_id, owner_id, lease, dead)
                tx.stamp = Stamp(claim.execution_id, claim.epoch)
                yield claim, tx
                params = {"sid": session_id, "epoch": claim.epoch}
                await _SET_EPOCH.rows(tx.conn, tx.dialect, params)
        except _RowLocked:
            raise await self._held(session_id) from None

    async def _acquire(
        self,
        tx: Tx,
        session_id: str,
        execution_id: str,
        owner_id: str,
        lease: int,
        dead: str | None,
    ) -> Claim:
        if tx.dialect == "postgresql":
            # For the whole acquisition: it waits for the claim row, or for a concurrent
            # acquirer's first claim, no longer than this (then ``ClaimHeldError``).
            timeout = f"SET LOCAL lock_timeout = {self.db.waits.claim_lock_ms}"
            await tx.conn.exec_driver_sql(timeout)
        with _lock_bounded():
            current = await self._lock_current(tx, session_id)
        # The clock is read after the lock, which this acquisition may have waited for: a
        # verdict on the claim's expiry from before the wait would be stale. The new claim's
        # expiry is computed in SQL, by the statement that writes it.
        last_epoch, now = await self._session_epoch_and_now(tx, session_id)
        if current is None:
            return await self._insert(tx, session_id, execution_id, owner_id, last_epoch + 1, lease)
        if current.expires_at > now and current.id != dead:
            if current.id == execution_id and current.owner_id == owner_id:
                return await self._renew_in(tx, _row_claim(current, lease), None)
            raise ClaimHeldError(session_id, current.id, int(current.expires_at), int(now))
        epoch = max(last_epoch, int(current.epoch)) + 1
        await self._record_recovery(tx, current, now)
        params = {
            "sid": session_id,
            "current": current.id,
            **_claim_params(execution_id, owner_id, epoch, lease),
        }
        ((expires_at,),) = await _TAKE_OVER.rows(tx.conn, tx.dialect, params)
        return Claim(session_id, execution_id, owner_id, epoch, int(expires_at), lease)

    async def _insert(
        self, tx: Tx, session_id: str, execution_id: str, owner_id: str, epoch: int, lease: int
    ) -> Claim:
        """The session's first claim since its last release.

        On PostgreSQL an INSERT that meets a concurrent acquirer's uncommitted row waits for
        it with its values already computed: should that acquirer roll back, this claim's
        expiry is early by the wait, at most the lock timeout (a sixth of the lease).
        """
        params = {"sid": session_id, **_claim_params(execution_id, owner_id, epoch, lease)}
        with _lock_bounded():
            inserted = await _INSERT_CLAIM.first(tx.conn, tx.dialect, params)
        if inserted is None:
            # Another acquirer committed first; its claim is live by construction.
            current = await self._lock_current(tx, session_id)
            assert current is not None
            raise ClaimHeldError(session_id, current.id, int(current.expires_at))
        return Claim(session_id, execution_id, owner_id, epoch, int(inserted[0]), lease)

    async def _held(self, session_id: str) -> ClaimHeldError:
        """Who holds the claim an acquisition could not lock in time, as last committed."""
        async with self.db.read(single=True) as conn:
            ((execution_id, expires_at, now),) = await _HOLDER.rows(
                conn, self.db.dialect, {"sid": session_id}
            )
        if execution_id is None:  # the holder is creating the session's first claim
            return ClaimHeldError(session_id, "(another acquisition)", int(now))
        return ClaimHeldError(session_id, execution_id, int(expires_at), int(now))

    async def _session_epoch_and_now(self, tx: Tx, session_id: str) -> tuple[int, int]:
        row = await _SESSION_EPOCH_AND_NOW.first(tx.conn, tx.dialect, {"sid": session_id})
        if row is None:
            raise SessionNotFoundError(session_id)
        return int(row[0]), int(row[1])

    async def _lock_current(self, tx: Tx, session_id: str) -> Any:
        row = await _LOCK_CURRENT.first(tx.conn, tx.dialect, {"sid": session_id})
        return None if row is None else _ExecutionRow(*row)

    async def _record_recovery(self, tx: Tx, dead: Any, now: int) -> None:
        # The resume budget belongs to the orphaned turn: a recovery that dies again inherits
        # the attempts already counted (rows are cleared only by a terminal event).
        inherited = sa.select(sa.func.coalesce(sa.func.max(recovery_table.c.attempts), 0)).where(
            recovery_table.c.session_id == dead.session_id
        )
        attempts = int((await tx.conn.execute(inherited)).scalar_one())
        await tx.conn.execute(
            insert(tx.dialect, recovery_table)
            .values(
                session_id=dead.session_id,
                execution_id=dead.id,
                phase=dead.phase,
                continuation_message_id=dead.assistant_message_id,
                wake_pending=True,
                attempts=attempts,
                time_created=now,
            )
            .on_conflict_do_nothing()
        )

    # --- renew, release, phase ------------------------------------------------------------------

    async def renew(self, claim: Claim) -> Claim:
        """Extend a live claim by its lease; ``ClaimLostError`` if it is not live any more."""
        return await self.db.transact(lambda tx: self._renew_in(tx, claim, None), renewal=True)

    async def owner(self, claim: Claim) -> str | None:
        """The owner of ``claim``'s row as last committed, if it is still that execution's."""
        async with self.db.read(single=True) as conn:
            row = await _HOLDER_OWNER.first(conn, self.db.dialect, {"sid": claim.session_id})
        if row is None or row[0] != claim.execution_id or int(row[1]) != claim.epoch:
            return None
        return str(row[2])

    async def reown(self, claim: Claim, seen: str) -> bool:
        """Make ``claim.owner_id`` the owner of the live claim of its execution and epoch, if
        its owner is still ``seen`` (read before the caller asked Temporal whether the new
        owner is the workflow's running run: a run reset meanwhile, whose successor took the
        claim first, cannot take it back). A workflow run that carries a claim on (a
        continue-as-new, a reset replaying the run that acquired it) drives it from here on,
        and the fence refuses the runs before it. The attempts the runs before it reached
        start again (the step's and every call's, the calls keeping their taker), so the new
        run's attempts, replayed from an earlier point, are not older than theirs, and a call
        one of them took still tells the new run that it may have run. False when there is no
        such live claim (released, taken over, expired, or owned by another run since)."""

        async def reown_in(tx: Tx) -> bool:
            current = await self._lock_current(tx, claim.session_id)
            _epoch, now = await self._session_epoch_and_now(tx, claim.session_id)  # after it
            if current is None or current.id != claim.execution_id:
                return False
            if int(current.epoch) != claim.epoch or int(current.expires_at) <= now:
                return False
            if current.owner_id == claim.owner_id:
                return True
            if current.owner_id != seen:
                return False
            params = {"sid": claim.session_id, "owner": claim.owner_id}
            await _REOWN.rows(tx.conn, tx.dialect, params)
            await _RESTART_RUNS.rows(tx.conn, tx.dialect, params)
            return True

        return await self.db.transact(reown_in)

    async def release(self, claim: Claim) -> None:
        """Delete the claim (same fence); ``ClaimLostError`` if it was not live."""
        await self.db.transact(lambda tx: self.release_in(tx, claim))

    async def release_in(self, tx: Tx, claim: Claim) -> None:
        """``release`` inside ``tx``: the claim goes when (and only if) ``tx`` commits."""
        params = {
            "sid": claim.session_id,
            "eid": claim.execution_id,
            "owner": claim.owner_id,
            "epoch": claim.epoch,
        }
        if await _RELEASE.first(tx.conn, tx.dialect, params) is None:
            raise await self._lost(tx.conn, claim)

    async def set_phase(
        self,
        claim: Claim,
        phase: Phase,
        *,
        assistant_message_id: str | None = None,
        step_attempt: int | None = None,
    ) -> Claim:
        """Record what the execution is doing, so a takeover knows how to recover it."""

        async def record(tx: Tx) -> None:
            await self.record_phase(tx, claim, phase, assistant_message_id)

        await self.run_fenced(claim, record, step_attempt=step_attempt)
        return replace(claim, phase=phase, assistant_message_id=assistant_message_id)

    async def record_phase(
        self, tx: Tx, claim: Claim, phase: Phase, assistant_message_id: str | None = None
    ) -> None:
        """Record the phase inside a fenced ``tx`` (which already proved the claim live)."""
        params = {
            "sid": claim.session_id,
            "eid": claim.execution_id,
            "new_phase": phase,
            "mid": assistant_message_id,
        }
        await _RECORD_PHASE.rows(tx.conn, tx.dialect, params)

    async def extend_until(self, tx: Tx, claim: Claim, until_ms: int) -> None:
        """Inside a fenced ``tx``: keep the claim live at least until ``until_ms``."""
        await self._hold(tx, claim, sa.literal(until_ms, sa.BigInteger))

    async def hold_for(self, tx: Tx, claim: Claim, hold_ms: int) -> None:
        """Inside a fenced ``tx``: keep the claim live at least ``hold_ms`` from now, by the
        database clock (a call waiting for a person: the worker's clock may be off)."""
        await self._hold(tx, claim, now_ms(tx.dialect) + hold_ms)

    async def _hold(self, tx: Tx, claim: Claim, until: Any) -> None:
        longest = sa.func.max if tx.dialect == "sqlite" else sa.func.greatest
        await tx.conn.execute(
            execution_table.update()
            .where(_x.session_id == claim.session_id, _x.id == claim.execution_id)
            .values(expires_at=longest(_x.expires_at, until))
        )

    async def lease_again(self, tx: Tx, claim: Claim) -> None:
        """Inside a fenced ``tx``: back to the ordinary lease (db now + lease), ending a hold
        that ``extend_until`` made (a call that waited for a person was answered)."""
        await tx.conn.execute(
            execution_table.update()
            .where(_x.session_id == claim.session_id, _x.id == claim.execution_id)
            .values(expires_at=now_ms(tx.dialect) + claim.lease_ms)
        )

    @asynccontextmanager
    async def fenced(
        self, claim: Claim, *, step_attempt: int | None = None, run: ToolAttempt | None = None
    ) -> AsyncIterator[Tx]:
        """A write transaction that exists only while ``claim`` is live.

        Not retried: a serialization failure or a deadlock inside fails the caller, because a
        context manager cannot run its body again. Writes use ``run_fenced`` (catalogue C6).
        It renews first; a lost claim, a stale ``step_attempt`` or a tool call ``run`` that a
        later attempt took (``StaleAttemptError``) raises before anything else runs, and any
        later failure rolls back everything written inside.
        """
        async with self.db.write(stamp=Stamp(claim.execution_id, claim.epoch)) as tx:
            if run is None:
                await self._renew_in(tx, claim, step_attempt)
            else:
                await self._renew_for_run(tx, claim, run)
            yield tx

    async def _renew_for_run(self, tx: Tx, claim: Claim, run: ToolAttempt) -> None:
        """Renew, and check that ``run`` is its call's latest attempt, in one statement."""
        params = {**fence_params(claim), **run_params(run)}
        if await _RENEW_RUN.first(tx.conn, tx.dialect, params) is not None:
            return
        await ToolRuns().check(tx, run)  # a later attempt took the call: StaleAttemptError
        # Refused after the claim row changed while the fence waited for it (``fence.py``):
        # the row's lock is this transaction's now, and a new statement sees every commit.
        if await _RENEW_RUN.first(tx.conn, tx.dialect, params) is not None:
            return
        raise await self._lost(tx.conn, claim)

    async def run_fenced(
        self,
        claim: Claim,
        work: Callable[[Tx], Awaitable[T]],
        *,
        step_attempt: int | None = None,
        run: ToolAttempt | None = None,
        phase: tuple[Phase, str | None] | None = None,
    ) -> T:
        """``work`` in a ``fenced`` transaction, run again from the start after a serialization
        failure or a deadlock (``Database.transact``; catalogue C6): the fence is checked again
        by each run, in the transaction of its writes. ``work`` must touch nothing but its tx
        and compute its result afresh on each run. Any other error is raised at once, run once.

        ``phase`` (with a ``step_attempt``): the (phase, assistant message id) the transaction
        records, set by the fence's own statement rather than by one more (``record_phase``);
        it commits or rolls back with ``work`` like any of its writes.

        The product's fenced writes all go through here, not through ``fenced``, whose body a
        context manager cannot run again.
        """
        assert phase is None or (run is None and step_attempt is not None)

        async def fenced_work(tx: Tx) -> T:
            if run is None:
                await self._renew_in(tx, claim, step_attempt, phase)
            else:
                await self._renew_for_run(tx, claim, run)
            return await work(tx)

        return await self.db.transact(fenced_work, stamp=Stamp(claim.execution_id, claim.epoch))

    async def _renew_in(
        self,
        tx: Tx,
        claim: Claim,
        step_attempt: int | None,
        phase: tuple[Phase, str | None] | None = None,
    ) -> Claim:
        params = fence_params(claim)
        if step_attempt is None:
            statement = _RENEW
        elif phase is None:
            params["attempt"] = step_attempt
            statement = _RENEW_ATTEMPT
        else:
            params.update(attempt=step_attempt, new_phase=phase[0], new_mid=phase[1])
            statement = _RENEW_ATTEMPT_PHASE
        row = await statement.first(tx.conn, tx.dialect, params)
        if row is None:
            raise await self._lost(tx.conn, claim, step_attempt)
        expires_at, attempt, now_phase, assistant_message_id = row
        return replace(
            claim,
            expires_at=int(expires_at),
            step_attempt=int(attempt),
            phase=now_phase,
            assistant_message_id=assistant_message_id,
        )

    async def why_lost(self, claim: Claim, step_attempt: int | None = None) -> ClaimLostError:
        """The error that explains why a fenced write of ``claim`` was refused."""
        async with self.db.read(single=True) as conn:
            return await self._lost(conn, claim, step_attempt)

    async def _lost(
        self, conn: Connection, claim: Claim, step_attempt: int | None = None
    ) -> ClaimLostError:
        query = sa.select(execution_table, now_ms(self.db.dialect).label("now")).where(
            _x.session_id == claim.session_id
        )
        row = (await conn.execute(query)).one_or_none()
        if row is None:
            return ClaimLostError(claim.session_id, claim.execution_id, CLAIM_RELEASED)
        if row.id != claim.execution_id or row.epoch != claim.epoch:
            reason = f"taken over by execution {row.id} (epoch {row.epoch})"
            return ClaimLostError(claim.session_id, claim.execution_id, reason)
        if row.owner_id != claim.owner_id:
            reason = f"owned by {row.owner_id}, not {claim.owner_id}"
            return ClaimLostError(claim.session_id, claim.execution_id, reason)
        if row.expires_at <= row.now:
            reason = f"the lease expired at {row.expires_at} (database clock {row.now})"
            return ClaimLostError(claim.session_id, claim.execution_id, reason)
        assert step_attempt is not None
        return StaleAttemptError(
            claim.session_id, claim.execution_id, step_attempt, int(row.step_attempt)
        )

    # --- reads and recovery ---------------------------------------------------------------------

    async def current(self, session_id: str) -> Claim | None:
        """The session's claim row, live or expired (None when released)."""
        async with self.db.read(single=True) as conn:
            query = sa.select(execution_table).where(_x.session_id == session_id)
            row = (await conn.execute(query)).one_or_none()
        return None if row is None else _row_claim(row, self.lease_ms)

    async def expired(
        self, *, limit: int = 100, phases: tuple[Phase, ...] = ("ready", "unknown", "continue")
    ) -> list[str]:
        """Sessions whose claim expired without a release, oldest first: recovery candidates."""
        return await self._claimed(_x.expires_at <= now_ms(self.db.dialect), limit, phases)

    async def live(
        self, *, limit: int = 1000, phases: tuple[Phase, ...] = ("unknown", "continue")
    ) -> list[str]:
        """Sessions whose claim is live in one of ``phases``, soonest expiry first: the sweep
        asks Temporal whether each one's owner still runs (``activities/sweep.py``)."""
        return await self._claimed(_x.expires_at > now_ms(self.db.dialect), limit, phases)

    async def _claimed(self, when: Any, limit: int, phases: tuple[Phase, ...]) -> list[str]:
        query = (
            sa.select(_x.session_id)
            .where(when, _x.phase.in_(phases))
            .order_by(_x.expires_at)
            .limit(limit)
        )
        async with self.db.read(single=True) as conn:
            return list((await conn.execute(query)).scalars())

    async def recoveries(self, session_id: str) -> list[Recovery]:
        """Pending recoveries: ``wake_pending`` without error, oldest first, then execution id."""
        async with self.db.read(single=True) as conn:
            rows = await _RECOVERIES.rows(conn, self.db.dialect, {"sid": session_id})
        return [Recovery(**dict(zip(_RECOVERY_COLUMNS, row, strict=True))) for row in rows]

    async def begin_recovery(self, tx: Tx, recovery: Recovery) -> int:
        """Count one resume of ``recovery`` durably (inside a fenced ``tx``); returns the count."""
        r = recovery_table.c
        result = await tx.conn.execute(
            recovery_table.update()
            .where(r.session_id == recovery.session_id, r.execution_id == recovery.execution_id)
            .values(attempts=r.attempts + 1, wake_pending=False)
            .returning(r.attempts)
        )
        return int(result.scalar_one())

    async def fail_recovery(self, tx: Tx, recovery: Recovery, error: str) -> None:
        r = recovery_table.c
        await tx.conn.execute(
            recovery_table.update()
            .where(r.session_id == recovery.session_id, r.execution_id == recovery.execution_id)
            .values(recovery_error=error, wake_pending=False)
        )

    async def clear_recoveries(self, tx: Tx, session_id: str) -> None:
        """Forget the session's recoveries: a terminal event ended the orphaned turn."""
        await _CLEAR_RECOVERIES.rows(tx.conn, tx.dialect, {"sid": session_id})


def fence_params(claim: Claim) -> dict[str, Any]:
    """The parameters every fence statement takes: whose claim, at which epoch, renewed by
    how much (``sid``, ``eid``, ``owner``, ``epoch``, ``lease``)."""
    return {
        "sid": claim.session_id,
        "eid": claim.execution_id,
        "owner": claim.owner_id,
        "epoch": claim.epoch,
        "lease": claim.lease_ms,
    }


def run_params(run: ToolAttempt) -> dict[str, Any]:
    """A tool call's attempt, as the fences that check it take it (``mid``, ``cid``,
    ``run_attempt``)."""
    return {"mid": run.assistant_message_id, "cid": run.call_id, "run_attempt": run.attempt}


def _renew(*, attempt: bool = False, run: bool = False, phase: bool = False) -> Prepared:
    """Renew a live claim (the fence of every fenced transaction, ``store/fence.py``),
    optionally moving its step attempt forward: a newer attempt fences out the older one's late
    writes. ``run``: only while no later attempt of a tool call took it
    (``store/tool_runs.py``), in the same statement. ``phase``: also record the phase and
    assistant message (``new_phase``, ``new_mid``), as ``record_phase`` would."""
    rules = Fence(attempt="advance" if attempt else None, run=run, phase=phase)
    return Prepared(lambda dialect: fence(dialect, rules, _RENEWED))


_RENEWED = ("expires_at", "step_attempt", "phase", "assistant_message_id")
_RENEW = _renew()
_RENEW_ATTEMPT = _renew(attempt=True)
_RENEW_ATTEMPT_PHASE = _renew(attempt=True, phase=True)
_RENEW_RUN = _renew(run=True)
_RECORD_PHASE = Prepared(
    lambda _dialect: (
        execution_table.update()
        .where(_x.session_id == sa.bindparam("sid"), _x.id == sa.bindparam("eid"))
        .values(phase=sa.bindparam("new_phase"), assistant_message_id=sa.bindparam("mid"))
    )
)


# --- the acquisition's statements (built once, see store.prepared) ------------------------------

_ExecutionRow = namedtuple(  # type: ignore[misc]
    "_ExecutionRow", [c.name for c in execution_table.columns]
)
_SESSION_EPOCH_AND_NOW = Prepared(
    lambda dialect: sa.select(session_table.c.claim_epoch, now_ms(dialect)).where(
        session_table.c.id == sa.bindparam("sid")
    )
)
_HOLDER = Prepared(
    lambda dialect: sa.select(
        sa.select(_x.id).where(_x.session_id == sa.bindparam("sid")).scalar_subquery(),
        sa.select(_x.expires_at).where(_x.session_id == sa.bindparam("sid")).scalar_subquery(),
        now_ms(dialect),
    )
)
_LOCK_CURRENT = Prepared(
    lambda dialect: for_update(
        dialect, sa.select(execution_table).where(_x.session_id == sa.bindparam("sid"))
    )
)


def _new_claim_values(dialect: DialectName) -> dict[str, Any]:
    """A fresh claim's columns; its times from the database clock, in the statement itself."""
    return {
        "id": sa.bindparam("eid"),
        "owner_id": sa.bindparam("owner"),
        "epoch": sa.bindparam("epoch"),
        "phase": "ready",
        "assistant_message_id": sa.null(),
        "step_attempt": 0,
        "time_created": now_ms(dialect),
        "expires_at": now_ms(dialect) + sa.bindparam("lease", type_=sa.BigInteger),
    }


_INSERT_CLAIM = Prepared(
    lambda dialect: (
        insert(dialect, execution_table)
        .values(session_id=sa.bindparam("sid"), **_new_claim_values(dialect))
        .on_conflict_do_nothing(index_elements=[_x.session_id])
        .returning(_x.expires_at)
    )
)
_TAKE_OVER = Prepared(
    lambda dialect: (
        execution_table.update()
        .where(_x.session_id == sa.bindparam("sid"), _x.id == sa.bindparam("current"))
        .values(**_new_claim_values(dialect))
        .returning(_x.expires_at)
    )
)
_SET_EPOCH = Prepared(
    lambda _dialect: (
        session_table.update()
        .where(session_table.c.id == sa.bindparam("sid"))
        .values(claim_epoch=sa.bindparam("epoch"))
    )
)
_RELEASE = Prepared(lambda dialect: fence(dialect, Fence(release=True), ("id",)))
_REOWN = Prepared(
    lambda _dialect: (
        execution_table.update()
        .where(_x.session_id == sa.bindparam("sid"))
        .values(owner_id=sa.bindparam("owner"), step_attempt=0)
    )
)
_RESTART_RUNS = Prepared(
    lambda _dialect: (
        tool_run_table.update()
        .where(tool_run_table.c.session_id == sa.bindparam("sid"))
        .values(attempt=0)
    )
)
_HOLDER_OWNER = Prepared(
    lambda _dialect: sa.select(_x.id, _x.epoch, _x.owner_id).where(
        _x.session_id == sa.bindparam("sid")
    )
)

_RECOVERY_COLUMNS = tuple(c.name for c in recovery_table.columns)
_RECOVERIES = Prepared(
    lambda _dialect: (
        sa.select(recovery_table)
        .where(
            recovery_table.c.session_id == sa.bindparam("sid"),
            recovery_table.c.wake_pending,
            recovery_table.c.recovery_error.is_(None),
        )
        .order_by(recovery_table.c.time_created, recovery_table.c.execution_id)
    )
)
_CLEAR_RECOVERIES = Prepared(
    lambda _dialect: recovery_table.delete().where(
        recovery_table.c.session_id == sa.bindparam("sid")
    )
)


def _claim_params(execution_id: str, owner_id: str, epoch: int, lease: int) -> dict[str, Any]:
    return {"eid": execution_id, "owner": owner_id, "epoch": epoch, "lease": lease}


def _row_claim(row: Any, lease_ms: int) -> Claim:
    return Claim(
        session_id=row.session_id,
        execution_id=row.id,
        owner_id=row.owner_id,
        epoch=int(row.epoch),
        expires_at=int(row.expires_at),
        lease_ms=lease_ms,
        phase=row.phase,
        step_attempt=int(row.step_attempt),
        assistant_message_id=row.assistant_message_id,
    )
