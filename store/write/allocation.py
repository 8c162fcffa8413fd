"""Seq allocation, written once: each event of an aggregate takes the next seq of that
aggregate's row in ``session_sequence``, reserved by an upsert that returns the last one.

The general path (``EventStore``) runs it as a statement of its own; the one-statement writes
(``fast.py``) compile the same statement as a CTE after their fence, so a refused write reserves
nothing. The upsert locks the sequence row: two writers of one aggregate queue on it, and seqs
come out gap-free and in commit order per aggregate.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from store.dialect import DialectName, insert
from store.schema import sequence_table


def allocation(
    dialect: DialectName, *, after: str | None = None, agg: str = "agg", n: int | None = None
) -> Any:
    """Seq allocation, its one definition: reserve ``n`` seqs of aggregate ``agg`` under its
    sequence row (created at the first), returning the last one. ``after``: the hot path's
    form, a row only for each row of that CTE (the fence, or what it guards), so a refused
    write reserves nothing. ``n`` given: a constant count, else the parameter ``n``."""
    count: Any = sa.bindparam("n", type_=sa.BigInteger) if n is None else sa.literal_column(str(n))
    aggregate = sa.bindparam(agg, type_=sequence_table.c.aggregate_id.type)
    last_before = count - sa.literal_column("1")  # a literal: the hot path embeds this text
    statement = insert(dialect, sequence_table)
    if after is None:
        statement = statement.values(aggregate_id=aggregate, seq=last_before)
    else:
        source = sa.select(aggregate, last_before).select_from(sa.table(after))
        statement = statement.from_select(["aggregate_id", "seq"], source)
    return statement.on_conflict_do_update(
        index_elements=[sequence_table.c.aggregate_id], set_={"seq": sequence_table.c.seq + count}
    ).returning(sequence_table.c.seq)
