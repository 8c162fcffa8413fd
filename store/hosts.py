"""Host leases: which workers serve each host's tools, as the database clock sees them.

A worker started for a host renews its row every lease/3 (``activities/hosts.py``); the host is
*live* while any of its rows was seen within the lease, *late* when it is live but none was
seen for two renewals (its worker is probably restarting), and *gone* after that. A row also
says what the worker offers (its tools, for turns that run on workers of other hosts) and which
version it runs. A clean shutdown withdraws the row, so a host whose last worker stopped is gone
at once; a killed worker's row runs out with its lease.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from sessionflow.ids import validate_host
from store import codec
from store.db import Database
from store.dialect import insert, now_ms
from store.schema import host_lease_table

_h = host_lease_table.c
HostStatus = Literal["live", "late", "gone"]
# Rows of a host's dead workers older than this go when another of its workers starts.
_FORGET_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class HostWorker:
    """One worker's lease on a host, as of the moment it was read."""

    host: str
    worker: str
    task_queue: str
    version: str
    tools: tuple[str, ...]
    started_at: int
    last_seen: int
    seen_ms_ago: int
    status: HostStatus


@dataclass(frozen=True)
class HostState:
    """A host as its workers' leases say: ``ever`` is False for a host that never registered."""

    host: str
    status: HostStatus
    ever: bool
    seen_ms_ago: int | None
    workers: int  # live ones

    @property
    def live(self) -> bool:
        return self.status != "gone"


class Hosts:
    def __init__(self, db: Database, *, lease_ms: int) -> None:
        self.db = db
        self.lease_ms = lease_ms

    def status(self, seen_ms_ago: int) -> HostStatus:
        if seen_ms_ago >= self.lease_ms:
            return "gone"
        return "late" if seen_ms_ago > 2 * self.lease_ms // 3 + 1000 else "live"

    async def renew(
        self,
        host: str,
        worker: str,
        *,
        task_queue: str,
        version: str,
        tools: builtins.list[dict[str, Any]] | None = None,
    ) -> None:
        """Renew ``worker``'s lease on ``host`` (creating it, with ``tools``, the first time;
        ``tools`` given again replaces what it offers)."""
        validate_host(host)
        now = now_ms(self.db.dialect)
        values: dict[str, Any] = {
            "host": host,
            "worker": worker,
            "task_queue": task_queue,
            "version": version,
            "tools": codec.dumps(tools or []),
            "started_at": now,
            "last_seen": now,
        }
        changed: dict[str, Any] = {"last_seen": now, "task_queue": task_queue}
        if tools is not None:
            changed.update(tools=values["tools"], version=version, started_at=now)
        upsert = insert(self.db.dialect, host_lease_table).values(**values)
        upsert = upsert.on_conflict_do_update(index_elements=[_h.host, _h.worker], set_=changed)
        async with self.db.write() as tx:
            await tx.conn.execute(upsert)
            if tools is not None:  # a worker that starts forgets its host's long-dead workers
                forget = host_lease_table.delete().where(
                    _h.host == host, _h.worker != worker, _h.last_seen < now - _FORGET_MS
                )
                await tx.conn.execute(forget)

    async def withdraw(self, host: str, worker: str) -> None:
        """``worker`` stopped cleanly: its lease ends now (the host is gone if it was the last)."""
        expired = now_ms(self.db.dialect) - self.lease_ms
        ended = host_lease_table.update().where(_h.host == host, _h.worker == worker)
        async with self.db.write() as tx:
            await tx.conn.execute(ended.values(last_seen=expired))

    async def workers(self, host: str | None = None) -> builtins.list[HostWorker]:
        """Every worker lease (of ``host``), most recently seen first."""
        query = sa.select(host_lease_table, now_ms(self.db.dialect).label("now"))
        if host is not None:
            query = query.where(_h.host == validate_host(host))
        async with self.db.read(single=True) as conn:
            rows = (await conn.execute(query.order_by(_h.last_seen.desc(), _h.host))).all()
        return [self._worker(row) for row in rows]

    async def state(self, host: str) -> HostState:
        workers = await self.workers(host)
        if not workers:
            return HostState(host, "gone", ever=False, seen_ms_ago=None, workers=0)
        latest = workers[0]
        live = sum(1 for worker in workers if worker.status != "gone")
        return HostState(host, latest.status, True, latest.seen_ms_ago, live)

    async def offered(self, host: str) -> builtins.list[dict[str, Any]] | None:
        """What the most recently seen worker of ``host`` offers (also when it is gone: its
        calls then fail saying so); None if the host never registered."""
        for worker in await self.workers(host):
            query = sa.select(_h.tools).where(_h.host == host, _h.worker == worker.worker)
            async with self.db.read(single=True) as conn:
                encoded = (await conn.execute(query)).scalar()
            tools = codec.loads(encoded) if encoded else []
            return tools if isinstance(tools, list) else []
        return None

    def _worker(self, row: Any) -> HostWorker:
        tools = codec.loads(row.tools) if row.tools else []
        names = tuple(t.get("name", "?") for t in tools if isinstance(t, dict))
        ago = max(0, int(row.now) - int(row.last_seen))
        return HostWorker(
            host=row.host,
            worker=row.worker,
            task_queue=row.task_queue,
            version=row.version,
            tools=names,
            started_at=int(row.started_at),
            last_seen=int(row.last_seen),
            seen_ms_ago=ago,
            status=self.status(ago),
        )
