"""Settings, read once at the edge into one frozen object.

Environment variables (all optional):

- ``SESSIONFLOW_DATABASE_URL``: SQLAlchemy URL of the store. Default: a SQLite file
  ``.sessionflow/sessionflow.db`` under the working directory. PostgreSQL:
  ``postgresql+psycopg://user@host/db``.
- ``SESSIONFLOW_LEASE_MS``: claim lease in milliseconds (default 30000); renewals every lease/3.
- ``SESSIONFLOW_MAX_EVENT_BYTES``: largest encoded event payload accepted (default 4 MiB).
- ``SESSIONFLOW_POLL_INTERVAL_MS``: how often followers poll when no doorbell rings
  (default 100 on SQLite, 1000 on PostgreSQL where LISTEN/NOTIFY is the doorbell).
- ``SESSIONFLOW_OTEL_EXPORTER``: ``none`` (default), ``console`` or ``otlp``.
- ``SESSIONFLOW_WORKFLOW_SANDBOX``: ``true`` runs the workers' workflows in Temporal's sandbox
  (default ``false``; the test suite always runs them there, see ``worker.build_worker``).
- ``SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES``: model turns and tool calls one worker runs at once
  (default 1000, see ``worker.build_worker``).
- ``SESSIONFLOW_BATCH_MS``: how long streamed tokens may wait to be written together (default
  30): a follower sees a token at most this long after the provider produced it, whatever the
  provider does next; a ready tool call is written at once.
- ``SESSIONFLOW_TURN_TIMEOUT_S``: the longest one model turn may stream, in seconds (default
  3600). A turn heartbeats while it streams, so a dead worker is noticed within seconds
  whatever this is; a turn that outlives it is restarted like one whose worker died.
- ``SESSIONFLOW_SANDBOX``: ``off`` runs ``bash`` commands without the bubblewrap sandbox
  (default ``on``; an explicit opt-out, logged at worker start, never a fallback).
- ``SESSIONFLOW_SANDBOX_MOUNT`` and ``SESSIONFLOW_SANDBOX_HIDE``: ``:``-separated paths the
  sandbox shows read-only beside the toolchains it finds on the worker's ``PATH``, and paths it
  hides (a toolchain root, or a secret inside one); see ``activities/tools/toolchain.py``.
- ``SESSIONFLOW_DB_POOL_SIZE`` and ``SESSIONFLOW_DB_POOL_OVERFLOW``: PostgreSQL connections one
  process keeps open, and may open beyond them at a peak (defaults 10 and 10). An activity holds
  one only for a transaction, never while a model streams or a tool runs, so the defaults serve
  the default 1,000 activity slots; claim renewals have two of their own besides
  (``store.db.Pools``). A worker process opens at most size + overflow + 8 connections.
- ``SESSIONFLOW_AGENTS``: a TOML or JSON file of custom agents (``activities/agents.py``).
- ``SESSIONFLOW_HOST``: the host whose tools this worker runs, on ``<task queue>@<host>``
  (default ``local``: the tools run on the shared queue, as on a single machine); also the
  host a client places new sessions on.
- ``SESSIONFLOW_SERVE``: ``all`` (default: turns and orchestration on the shared queue, and
  the host's tools), ``turns`` (no tools at all: a turn-only worker) or ``tools`` (only the
  host's tools: a machine that lends its workspaces, "remote brain, local hands").
- ``SESSIONFLOW_HOST_LEASE_MS``: how long a host whose workers stopped renewing still counts
  as running (default: ``SESSIONFLOW_LEASE_MS``); a call for a host gone longer fails at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_DATABASE_URL = "sqlite+aiosqlite:///.sessionflow/sessionflow.db"
M = TypeVar("M", bound=BaseModel)


class SettingsError(ValueError):
    """A setting read from the environment is invalid. The message names the variable the user
    set (not the field it fills), its value and what it takes."""


def from_environment(
    model: type[M],
    names: Sequence[tuple[str, str]],
    environ: Mapping[str, str],
    overrides: Mapping[str, object] | None = None,
) -> M:
    """``model`` from the variables ``names`` maps its fields to (unset or empty: the default),
    then ``overrides`` (a command line's flags; None: not given). An invalid value raises
    ``SettingsError`` naming the variable, or the field of an override."""
    values: dict[str, object] = {field: environ[name] for field, name in names if environ.get(name)}
    given = {key: value for key, value in (overrides or {}).items() if value is not None}
    values.update(given)
    try:
        return model.model_validate(values)
    except ValidationError as error:
        variables = dict(names)
        problems = []
        for problem in error.errors():
            field = str(problem["loc"][0]) if problem["loc"] else "?"
            value = values.get(field)
            if field in given:  # a value the caller passed (a command line's flag)
                problems.append(f"{field}={value!r}: {problem['msg']}.")
            else:
                name = variables.get(field, field)
                problems.append(
                    f"setting {name}={value!r}: {problem['msg']}. "
                    "Fix it, or unset the variable to use its default."
                )
        raise SettingsError("Invalid " + " Invalid ".join(problems)) from None


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    database_url: str = DEFAULT_DATABASE_URL
    lease_ms: int = Field(default=30_000, ge=1_000)
    max_event_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    poll_interval_ms: int | None = Field(default=None, ge=10)
    otel_exporter: Literal["none", "console", "otlp"] = "none"
    workflow_sandbox: bool = False
    max_concurrent_activities: int = Field(default=1000, ge=1)
    turn_timeout_s: int = Field(default=3600, ge=1)
    # How long a busy period waits for a claim another live execution holds, then fails
    # ("claim.timeout"), keeping its input for the next one (catalogue C7).
    claim_wait_s: int = Field(default=3600, ge=1)
    retry_backoff_ms: int = Field(default=2000, ge=1)
    batch_ms: int = Field(default=30, ge=1, le=1000)
    sandbox: bool = True
    sandbox_mount: tuple[str, ...] = ()
    sandbox_hide: tuple[str, ...] = ()
    agents_file: str | None = None
    # How deep a tree of subagent sessions may grow (a root session is depth 0).
    max_depth: int = Field(default=3, ge=0, le=32)
    db_pool_size: int = Field(default=10, ge=1)
    db_pool_overflow: int = Field(default=10, ge=0)
    host: str = Field(default="local", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    serve: Literal["all", "turns", "tools"] = "all"
    # A host's lease (its workers renew it every third); None: the claim's ``lease_ms``.
    host_lease_ms: int | None = Field(default=None, ge=1_000)
    # The file-change journal keeps a changed file's content up to this many bytes (rewind).
    journal_max_bytes: int = Field(default=1024 * 1024, ge=0, le=256 * 1024 * 1024)
    # The journal's kept content is pruned once no entry named it for this many days, and
    # beyond this many bytes in all, what was named longest ago first (0: no such bound).
    journal_keep_days: float = Field(default=30.0, ge=0)
    journal_max_total_bytes: int = Field(default=8 * 1024**3, ge=0)

    @property
    def host_lease(self) -> int:
        """How long a host's silent workers count as running (ms)."""
        return self.lease_ms if self.host_lease_ms is None else self.host_lease_ms

    @field_validator("sandbox_mount", "sandbox_hide", mode="before")
    @classmethod
    def _paths(cls, value: object) -> object:
        """A ``PATH``-like list of paths, from the environment."""
        if isinstance(value, str):
            return tuple(part for part in value.split(os.pathsep) if part.strip())
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return from_environment(cls, _VARIABLES, env)


_VARIABLES = (
    ("database_url", "SESSIONFLOW_DATABASE_URL"),
    ("lease_ms", "SESSIONFLOW_LEASE_MS"),
    ("max_event_bytes", "SESSIONFLOW_MAX_EVENT_BYTES"),
    ("poll_interval_ms", "SESSIONFLOW_POLL_INTERVAL_MS"),
    ("otel_exporter", "SESSIONFLOW_OTEL_EXPORTER"),
    ("workflow_sandbox", "SESSIONFLOW_WORKFLOW_SANDBOX"),
    ("max_concurrent_activities", "SESSIONFLOW_MAX_CONCURRENT_ACTIVITIES"),
    ("turn_timeout_s", "SESSIONFLOW_TURN_TIMEOUT_S"),
    ("claim_wait_s", "SESSIONFLOW_CLAIM_WAIT_S"),
    ("retry_backoff_ms", "SESSIONFLOW_RETRY_BACKOFF_MS"),
    ("batch_ms", "SESSIONFLOW_BATCH_MS"),
    ("sandbox", "SESSIONFLOW_SANDBOX"),
    ("sandbox_mount", "SESSIONFLOW_SANDBOX_MOUNT"),
    ("sandbox_hide", "SESSIONFLOW_SANDBOX_HIDE"),
    ("agents_file", "SESSIONFLOW_AGENTS"),
    ("max_depth", "SESSIONFLOW_MAX_DEPTH"),
    ("db_pool_size", "SESSIONFLOW_DB_POOL_SIZE"),
    ("db_pool_overflow", "SESSIONFLOW_DB_POOL_OVERFLOW"),
    ("host", "SESSIONFLOW_HOST"),
    ("serve", "SESSIONFLOW_SERVE"),
    ("host_lease_ms", "SESSIONFLOW_HOST_LEASE_MS"),
    ("journal_max_bytes", "SESSIONFLOW_JOURNAL_MAX_BYTES"),
    ("journal_keep_days", "SESSIONFLOW_JOURNAL_KEEP_DAYS"),
    ("journal_max_total_bytes", "SESSIONFLOW_JOURNAL_MAX_TOTAL_BYTES"),
)
