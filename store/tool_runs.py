"""Tool runs: which attempt of ``run_tool`` owns a call; the fence of that call's writes.

Temporal starts a new attempt of an activity while an older one may still be running (its
worker paused, or cut off from the server). Both hold the same claim, so the claim cannot tell
them apart. Each call's row names the latest attempt that took it (``take``, before the tool
runs); every write for the call (progress, result) checks it in its fenced transaction
(``check``), and a write from an older attempt is refused with ``StaleAttemptError``. Fenced
transactions of one session are serialized by the claim, so reading then writing the row is safe.

The row also tells a retried attempt whether an earlier one may have started the tool: an attempt
takes the call only just before it runs it, so without a row nothing ran.

It also names the workflow run whose attempt took the call (``owner``). A reset run replays the
old run's history and issues the same activity again, attempt numbers included: a take by the
same attempt from another run is not that attempt's own retry, and the old run's attempt may
have run the tool (``take_run``). The claim's fence refuses the old run's writes once the new
one has written (``activities/runtime.py: own``).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from sessionflow.errors import StaleAttemptError
from store.db import Tx
from store.dialect import now_ms
from store.prepared import Prepared
from store.schema import tool_run_table

_t = tool_run_table.c


@dataclass(frozen=True)
class ToolAttempt:
    """One attempt of ``run_tool`` at one call, under an execution's claim."""

    session_id: str
    execution_id: str
    assistant_message_id: str
    call_id: str
    attempt: int
    owner: str | None = None  # the workflow run of the attempt (``workflow id/run id``)


@dataclass(frozen=True)
class Taken:
    """What had taken a call before a take: its attempt (None: nothing ever started the tool)
    and whether that was another workflow run's attempt of the same number."""

    previous: int | None
    other_run: bool = False

    def may_have_run(self, attempt: int) -> bool:
        """Whether someone other than this very attempt may have started the tool."""
        return self.previous is not None and (self.previous < attempt or self.other_run)


class ToolRuns:
    async def take(self, tx: Tx, run: ToolAttempt) -> int | None:
        """Make ``run`` the call's latest attempt, inside a fenced ``tx``.

        Returns the attempt that had taken the call before (None: no attempt ever started the
        tool); raises ``StaleAttemptError`` when a later attempt took it.
        """
        return (await self.take_run(tx, run)).previous

    async def take_run(self, tx: Tx, run: ToolAttempt) -> Taken:
        """``take``, also telling a take by the same attempt of another run (``Taken``)."""
        previous, owner = await self._latest(tx, run)
        if previous is None:
            await _INSERT.rows(tx.conn, tx.dialect, _params(run))
            return Taken(None)
        other = previous == run.attempt and run.owner is not None and owner != run.owner
        if previous < run.attempt or other:
            await _UPDATE.rows(tx.conn, tx.dialect, _params(run))
        return Taken(previous, other)

    async def check(self, tx: Tx, run: ToolAttempt) -> None:
        """Inside a fenced ``tx``: refuse the write if a later attempt took the call."""
        await self._latest(tx, run)

    async def _latest(self, tx: Tx, run: ToolAttempt) -> tuple[int | None, str | None]:
        row = await _LATEST.first(tx.conn, tx.dialect, _params(run))
        latest = None if row is None else int(row[0])
        if latest is not None and latest > run.attempt:
            raise StaleAttemptError(
                run.session_id, run.execution_id, run.attempt, latest, what=f"tool {run.call_id}"
            )
        return latest, None if row is None else row[1]


def _params(run: ToolAttempt) -> dict[str, object]:
    return {
        "sid": run.session_id,
        "mid": run.assistant_message_id,
        "cid": run.call_id,
        "attempt": run.attempt,
        "owner": run.owner,
    }


def _key() -> list[sa.ColumnElement[bool]]:
    return [
        _t.session_id == sa.bindparam("sid"),
        _t.assistant_message_id == sa.bindparam("mid"),
        _t.call_id == sa.bindparam("cid"),
    ]


_LATEST = Prepared(lambda _dialect: sa.select(_t.attempt, _t.owner_id).where(*_key()))
_INSERT = Prepared(
    lambda dialect: tool_run_table.insert().values(
        session_id=sa.bindparam("sid"),
        assistant_message_id=sa.bindparam("mid"),
        call_id=sa.bindparam("cid"),
        attempt=sa.bindparam("attempt"),
        time_created=now_ms(dialect),
        owner_id=sa.bindparam("owner"),
    )
)
_UPDATE = Prepared(
    lambda _dialect: (
        tool_run_table.update()
        .where(*_key())
        .values(attempt=sa.bindparam("attempt"), owner_id=sa.bindparam("owner"))
    )
)
