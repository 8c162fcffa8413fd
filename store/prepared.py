"""Hot statements: built once with named parameters, compiled once per dialect.

Building a Core statement for every call and letting SQLAlchemy find its compiled form again
(a cache key walk over the whole expression) costs more than SQLite takes to run it. The
statements every drain step runs -- fencing, sequence allocation, event inserts, message reads
and write-backs -- are built here once instead, and run as driver SQL: on the inline SQLite
connection straight on the sqlite3 connection, elsewhere through ``exec_driver_sql``.

Results are plain row tuples, in the statement's column order.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg as pg_dialect
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.exc import IntegrityError

from store.db import Connection, InlineConnection
from store.dialect import DialectName

_DIALECTS: dict[DialectName, sa.Dialect] = {
    # Named parameters: sqlite3 takes the caller's dict as it is (no tuple built per call).
    "sqlite": pysqlite.dialect(paramstyle="named"),
    "postgresql": pg_dialect.dialect(),  # type: ignore[no-untyped-call]
}
# What a driver raises for a constraint violation, on either path.
INTEGRITY_ERRORS = (IntegrityError, sqlite3.IntegrityError)


def compile_text(statement: Any, dialect: DialectName) -> str:
    """``statement``'s SQL as the dialect's driver takes it (named parameters)."""
    compiled = statement.compile(dialect=_DIALECTS[dialect])
    assert not compiled.positional, "both drivers take named parameters"
    return str(compiled)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    defaults: dict[str, Any]  # values of the statement's own literals


def dialect_of_connection(conn: Connection) -> DialectName:
    if isinstance(conn, InlineConnection):
        return "sqlite"
    name = conn.dialect.name  # type: ignore[attr-defined]
    assert name in ("sqlite", "postgresql"), name
    return "sqlite" if name == "sqlite" else "postgresql"


class Prepared:
    """One statement (per dialect, from ``build``) run with a dict of named parameters."""

    def __init__(self, build: Callable[[DialectName], Any]) -> None:
        self._build = build
        self._compiled: dict[DialectName, _Compiled] = {}

    def compiled(self, dialect: DialectName) -> _Compiled:
        found = self._compiled.get(dialect)
        if found is None:
            compiled = self._build(dialect).compile(dialect=_DIALECTS[dialect])
            assert not compiled.positional, "both drivers take named parameters"
            defaults = {k: v for k, v in compiled.params.items() if v is not None}
            found = self._compiled[dialect] = _Compiled(str(compiled), defaults)
        return found

    @staticmethod
    def _args(compiled: _Compiled, params: dict[str, Any]) -> dict[str, Any]:
        return {**compiled.defaults, **params} if compiled.defaults else params

    async def rows(
        self, conn: Connection, dialect: DialectName, params: dict[str, Any]
    ) -> list[Any]:
        """Run it; every row it returns (an empty list for statements returning none)."""
        compiled = self.compiled(dialect)
        args = self._args(compiled, params)
        if isinstance(conn, InlineConnection):
            rows: list[Any] = conn.driver_connection().execute(compiled.sql, args).fetchall()
            return rows
        result = await conn.exec_driver_sql(compiled.sql, args)
        return list(result.all()) if result.returns_rows else []

    async def first(
        self, conn: Connection, dialect: DialectName, params: dict[str, Any]
    ) -> Any | None:
        rows = await self.rows(conn, dialect, params)
        return rows[0] if rows else None

    async def scalar(self, conn: Connection, params: dict[str, Any]) -> Any | None:
        """The first column of the first row (None without rows), on ``conn``'s dialect."""
        row = await self.first(conn, dialect_of_connection(conn), params)
        return None if row is None else row[0]

    async def many(
        self, conn: Connection, dialect: DialectName, params: Sequence[dict[str, Any]]
    ) -> None:
        """Run it once per parameter set (``executemany``)."""
        compiled = self.compiled(dialect)
        args = [self._args(compiled, p) for p in params]
        if isinstance(conn, InlineConnection):
            conn.driver_connection().executemany(compiled.sql, args)
        else:
            await conn.exec_driver_sql(compiled.sql, args)
