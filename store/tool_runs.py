"""Tool runs: which attempt of ``run_tool`` owns a call; the fence of that call's writes.

Temporal starts a new attempt of an activity while an older one may still be running (its
worker paused, or cut off from the server). Both hold the same claim, so the claim cannot tell
them apart. Each call's row names the latest attempt that took it (``take``, before the tool
runs); every write for the call (progress, result) checks it in its fenced transaction
(``check``), and a write from an older attempt is refused with ``StaleAttemptError``. Fenced
transactions of one session are serialized by the claim, so reading then writing the row is safe.

The row also tells a retried attempt whether an earlier one may have started the tool: an attempt
takes the call only just before it runs it, so without a row nothing ran.
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


class ToolRuns:
    async def take(self, tx: Tx, run: ToolAttempt) -> int | None:
        """Make ``run`` the call's latest attempt, inside a fenced ``tx``.

        Returns the attempt that had taken the call before (None: no attempt ever started the
        tool); raises ``StaleAttemptError`` when a later attempt took it.
        """
        previous = await self._latest(tx, run)
        if previous is None:
            await _INSERT.rows(tx.conn, tx.dialect, _params(run))
        elif previous < run.attempt:
            await _UPDATE.rows(tx.conn, tx.dialect, _params(run))
        return previous

    async def check(self, tx: Tx, run: ToolAttempt) -> None:
        """Inside a fenced ``tx``: refuse the write if a later attempt took the call."""
        await self._latest(tx, run)

    async def _latest(self, tx: Tx, run: ToolAttempt) -> int | None:
        row = await _LATEST.first(tx.conn, tx.dialect, _params(run))
        latest = None if row is None else int(row[0])
        if latest is not None and latest > run.attempt:
            raise StaleAttemptError(
                run.session_id, run.execution_id, run.attempt, latest, what=f"tool {run.call_id}"
            )
        return latest


def _params(run: ToolAttempt) -> dict[str, object]:
    return {
        "sid": run.session_id,
        "mid": run.assistant_message_id,
        "cid": run.call_id,
        "attempt": run.attempt,
    }


def _key() -> list[sa.ColumnElement[bool]]:
    return [
        _t.session_id == sa.bindparam("sid"),
        _t.assistant_message_id == sa.bindparam("mid"),
        _t.call_id == sa.bindparam("cid"),
    ]


_LATEST = Prepared(lambda _dialect: sa.select(_t.attempt).where(*_key()))
_INSERT = Prepared(
    lambda dialect: tool_run_table.insert().values(
        session_id=sa.bindparam("sid"),
        assistant_message_id=sa.bindparam("mid"),
        call_id=sa.bindparam("cid"),
        attempt=sa.bindparam("attempt"),
        time_created=now_ms(dialect),
    )
)
_UPDATE = Prepared(
    lambda _dialect: tool_run_table.update().where(*_key()).values(attempt=sa.bindparam("attempt"))
)
