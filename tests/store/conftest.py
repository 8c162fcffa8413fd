"""Store fixtures for tests that do to PostgreSQL what must never reach anyone else's tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy.engine import make_url


def libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def own_database(postgres_url: str) -> Iterator[str]:
    """The URL of a fresh PostgreSQL database for this test alone, dropped afterwards.

    Other engineers run their tests against the same server at the same time: a test that
    changes a database's defaults or kills every backend connected to it does so here.
    """
    name = f"sf_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
