"""The claim's fence, written once: the statement that renews (or releases) a live claim, from
which every fenced write of a drain starts.

A claim is live while its row (``session_execution``) matches the session, execution, owner and
epoch and its ``expires_at`` is after the database clock (``dialect.now_ms``). Optionally the
fence also holds the step's attempt (``attempt``), a tool call's attempt (``run``), the claim
row's version as an earlier read saw it (``version``), and records the phase (``phase``).

On PostgreSQL, under READ COMMITTED, a statement that waits for a row lock re-checks only that
row, and only if the row changed: its clock, and any subquery on another table, keep the values
they had before the wait. So the fence locks the claim row first (``locked``), reads the clock
only after that lock (``clock``), and reads the tool call's attempt by locking its row too
(``run``, which returns the row's latest committed version, also when it changed during the
wait). Then:

- an expired claim cannot renew itself after waiting for a transaction that only locked the
  row, or rolled back (the clock was read before the wait);
- an older tool attempt cannot write after a newer attempt's take committed during its wait
  (the later attempt was invisible to the statement's snapshot).

The claim row is always locked before the tool run row, as every take orders them, so the two
locks cannot deadlock. On SQLite a write transaction holds the database's write lock from its
``BEGIN IMMEDIATE``, so its statements see every commit before it: the plain statement is the
same fence.

``fence(...)`` builds the statement as SQLAlchemy Core (``claims.py`` runs it through
``Prepared``); ``fence_ctes(...)`` compiles the same clauses to the CTE text that the hot
path's one-statement writes (``fast.py``) start with. ``NOW`` is the database clock as those
statements spell it, compiled from ``dialect.now_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from store.dialect import DialectName, now_ms
from store.prepared import compile_text
from store.schema import execution_table, tool_run_table

_x = execution_table.c
_r = tool_run_table.c
# ``advance``: the step's attempt moves to ``attempt``, refused for an older one (a general
# fenced write); ``optional``: the same unless ``attempt`` < 0 (the hot path's appends, which may
# carry none).
AttemptRule = Literal["advance", "optional"]


@dataclass(frozen=True)
class Fence:
    """Which rules one fence statement holds, beyond the claim itself."""

    attempt: AttemptRule | None = None
    run: bool = False  # a tool call's attempt: ``mid``, ``cid``, ``run_attempt``
    phase: bool = False  # records ``phase_param`` and ``mid_param``
    version: bool = False  # PostgreSQL: the claim row's ``xmin`` as read (``version``)
    release: bool = False  # delete the claim instead of renewing it
    # With ``run``, PostgreSQL: a call no attempt took yet is taken by this write (the hot
    # path's settlement of a retry-safe tool's first attempt), instead of refused after a wait.
    take: bool = False
    phase_param: str = "new_phase"
    mid_param: str = "new_mid"


def fence(dialect: DialectName, rules: Fence, returning: tuple[str, ...]) -> Any:
    """The fence as one Core statement, returning ``returning`` (columns of the claim row) for
    a live claim and no row otherwise."""
    renewed = _write(dialect, rules, returning)
    if dialect == "sqlite":
        return renewed
    cte = renewed.cte("renewed")
    return sa.select(*(cte.c[name] for name in returning))


def fence_ctes(rules: Fence, returning: tuple[str, ...] = ()) -> str:
    """PostgreSQL: the fence as the CTEs a one-statement write starts with (``locked``,
    ``clock``, maybe ``run``, then ``renewed``, which returns one row, ``1``, for a live
    claim), in psycopg's ``%(name)s`` parameters."""
    renewed = _write("postgresql", rules, returning or ())
    if not returning:
        renewed = renewed.returning(sa.literal_column("1"))
    statement: Any = sa.select(sa.literal_column("1")).select_from(renewed.cte("renewed"))
    text = compile_text(statement, "postgresql")
    head, tail = "WITH ", "\n SELECT 1 \nFROM renewed"
    assert text.startswith(head) and text.endswith(tail), text
    return text[len(head) : -len(tail)]


def _write(dialect: DialectName, rules: Fence, returning: tuple[str, ...]) -> Any:
    if dialect == "sqlite":
        row, now, locked = _x, now_ms(dialect), None
    else:
        locked = _locked()
        clock = sa.select(now_ms(dialect).label("now")).select_from(locked).cte("clock")
        row, now = locked.c, sa.select(clock.c.now).scalar_subquery()
    # The claim is judged on ``row``: on PostgreSQL the locked row's latest version, never the
    # version the statement's snapshot saw before it waited (a sibling write of the same live
    # claim may have renewed it meanwhile).
    live = [
        row.id == sa.bindparam("eid"),
        row.owner_id == sa.bindparam("owner"),
        row.epoch == sa.bindparam("epoch"),
        row.expires_at > now,
    ]
    values: dict[str, Any] = {}
    longest = sa.func.max if dialect == "sqlite" else sa.func.greatest
    if not rules.release:
        # Never shorter: a hold (a call waiting for a person) outlives the work meanwhile.
        values["expires_at"] = longest(_x.expires_at, now + sa.bindparam("lease"))
    attempt: Any = sa.bindparam("attempt")
    if rules.attempt == "advance":
        values["step_attempt"] = attempt
        live.append(row.step_attempt <= attempt)
    elif rules.attempt == "optional":
        values["step_attempt"] = longest(_x.step_attempt, attempt)
        live.append(sa.or_(attempt < sa.literal_column("0"), row.step_attempt <= attempt))
    if rules.phase:
        values["phase"] = sa.bindparam(rules.phase_param)
        values["assistant_message_id"] = sa.bindparam(rules.mid_param)
    if rules.version:
        assert locked is not None, "a row version is PostgreSQL's xmin"
        live.append(locked.c.version == sa.cast(sa.bindparam("version"), _Xid()))
    if rules.run and locked is not None:
        live.append(_run_is_seen(locked, now, live if rules.take else None))
    conditions: list[Any] = [_x.session_id == sa.bindparam("sid")]
    if locked is None:
        conditions += live
    else:
        conditions.append(sa.exists(sa.select(locked.c.id).where(*live)))
    if rules.run:
        conditions.append(~_later_attempt(locked).exists())
    statement = (
        execution_table.delete().where(*conditions)
        if rules.release
        else execution_table.update().where(*conditions).values(**values)
    )
    return statement.returning(*(_x[name] for name in returning)) if returning else statement


def _locked() -> Any:
    """The claim row, locked (PostgreSQL): its latest version, which the claim is judged on
    and the clock and the tool run are read after."""
    return (
        sa.select(
            _x.session_id,
            _x.id,
            _x.owner_id,
            _x.epoch,
            _x.expires_at,
            _x.step_attempt,
            sa.literal_column("xmin").label("version"),
        )
        .where(_x.session_id == sa.bindparam("sid"))
        .with_for_update()
        .cte("locked")
    )


def _run_is_seen(locked: Any, now: Any, live: list[Any] | None) -> Any:
    """Whether the statement can trust what it reads of the tool call's row. A row its
    snapshot saw is locked by ``run`` and read at its latest version. A row inserted while the
    statement waited (a newer attempt's first take: a retry-safe tool's first attempt takes
    nothing) is invisible to it: then the claim row must not have changed during the wait, or,
    with ``live`` (``Fence.take``), this write takes the call itself, which the row inserted
    meanwhile refuses (``ON CONFLICT`` sees every commit)."""
    seen = tool_run_table.alias("seen_run")
    visible = sa.exists(
        sa.select(seen.c.attempt).where(
            seen.c.session_id == sa.bindparam("sid"),
            seen.c.assistant_message_id == sa.bindparam("mid"),
            seen.c.call_id == sa.bindparam("cid"),
        )
    )
    if live is None:
        return sa.or_(visible, locked.c.version == _seen_version())
    columns = ["session_id", "assistant_message_id", "call_id", "attempt", "time_created"]
    # Typed as the columns they fill: each parameter is cast alike wherever it appears.
    values = [
        sa.bindparam(name, type_=tool_run_table.c[column].type)
        for name, column in zip(("sid", "mid", "cid", "run_attempt"), columns, strict=False)
    ]
    row = sa.select(*values, now).where(~visible, sa.exists(sa.select(locked.c.id).where(*live)))
    taken = (
        postgresql.insert(tool_run_table)
        .from_select(columns, row)
        .on_conflict_do_nothing()
        .returning(tool_run_table.c.attempt)
        .cte("taken")
    )
    return sa.or_(visible, sa.exists(sa.select(taken.c.attempt)))


def _seen_version() -> Any:
    """The claim row's version as the statement's snapshot saw it, unlocked: different from
    the locked one when another transaction wrote the row while this statement waited. A
    tool call's row that such a writer inserted (its first take) is invisible to this
    statement, so the run's fence then refuses and the caller reads again."""
    seen = execution_table.alias("seen")  # not the UPDATE's own row: nothing to correlate
    return (
        sa.select(sa.literal_column("seen.xmin"))
        .select_from(seen)
        .where(seen.c.session_id == sa.bindparam("sid"))
        .scalar_subquery()
    )


def _later_attempt(locked: Any | None) -> Any:
    """A later attempt of the tool call (``mid``, ``cid``) than ``run_attempt``; on PostgreSQL
    read by locking its row after the claim row, which returns its latest committed version."""
    key = [
        _r.session_id == sa.bindparam("sid"),
        _r.assistant_message_id == sa.bindparam("mid"),
        _r.call_id == sa.bindparam("cid"),
    ]
    if locked is None:
        return sa.select(_r.attempt).where(*key, _r.attempt > sa.bindparam("run_attempt"))
    after_claim = sa.exists(sa.select(locked.c.session_id))
    run = sa.select(_r.attempt).where(*key, after_claim).with_for_update(read=True).cte("run")
    return sa.select(run.c.attempt).where(run.c.attempt > sa.bindparam("run_attempt"))


class _Xid(sa.types.UserDefinedType[str]):
    """PostgreSQL's transaction id type, which a row's ``xmin`` is compared as."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "xid"


NOW: dict[DialectName, str] = {
    dialect: compile_text(now_ms(dialect), dialect) for dialect in ("sqlite", "postgresql")
}
