"""Store test fixtures, and helpers for tests that do to PostgreSQL what must never reach anyone
else's tests (each on its own database, the ``own_database`` fixture)."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import make_url


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def terminate_backends(admin_url: str, database: str) -> int:
    """``pg_terminate_backend`` of every connection to ``database`` (what a restart does to
    its clients); returns how many there were."""
    with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            [database],
        ).fetchone()
    assert row is not None
    return int(row[0])


def refuse_connections(admin_url: str, database: str) -> None:
    """``database`` goes down, as for a server restart: new connections are refused and every
    open one is terminated. Only this database: the server and everyone else's stay up."""
    with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
    terminate_backends(admin_url, database)


def allow_connections(admin_url: str, database: str) -> None:
    """``database`` comes back up after ``refuse_connections``."""
    with psycopg.connect(libpq(admin_url), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')


@pytest.fixture
def checks_invariants() -> bool:
    """Every store a test leaves keeps the log invariants (``tests/conftest.py``)."""
    return True
