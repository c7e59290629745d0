"""Metering records and what /metrics reads: the repositories (a Protocol each, and their
SQLAlchemy Core implementation over ``store.tables``).

A usage row is written in the transaction that completes the request it bills: on its own
(``UsageStore.record``), or with the stored response (``ResponseStore.save(usage=...)``, which
calls ``insert_usage`` in its transaction), so a crash leaves both or neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from shellbox.store.db import Database, insert_new
from shellbox.store.tables import containers, egress_events, sandbox_usage

UsageKind = Literal["responses", "messages", "call"]


@dataclass(frozen=True)
class SandboxUsage:
    """One request's sandbox time. Times are Unix milliseconds."""

    id: str  # the request's id: a response, message or call
    project: str
    api_key_id: str | None
    container_id: str
    kind: UsageKind
    started_at_ms: int
    ended_at_ms: int
    measured_ms: int
    billed_ms: int
    started_container: bool


@dataclass(frozen=True)
class UsageQuery:
    """Rows whose request ended in [start_ms, end_ms), counted in buckets of ``width_ms``
    starting at ``origin_ms``."""

    start_ms: int
    end_ms: int
    origin_ms: int
    width_ms: int
    project_ids: Sequence[str] = ()
    api_key_ids: Sequence[str] = ()
    by_project: bool = False


@dataclass(frozen=True)
class BucketTotal:
    bucket: int  # index from origin_ms
    project: str | None  # with by_project
    sessions: int  # distinct containers
    billed_ms: int
    requests: int


class UsageStore(Protocol):
    def record(self, usage: SandboxUsage) -> bool:
        """Write ``usage`` in a transaction of its own; False when its request was already
        billed (nothing is written)."""
        ...

    def totals(self, query: UsageQuery) -> list[BucketTotal]: ...

    def get(self, usage_id: str) -> SandboxUsage | None: ...


class StatsStore(Protocol):
    """What /metrics reads from the database at each scrape."""

    def containers_by_status(self) -> dict[str, int]: ...

    def egress_decisions(self) -> dict[str, int]: ...

    def billed_ms_by_project(self) -> dict[str, int]: ...


def insert_usage(conn: Connection, usage: SandboxUsage) -> bool:
    """Write ``usage`` in the caller's transaction (for the repositories of this package);
    False when its request was already billed (nothing is written)."""
    statement = insert_new(conn.dialect, sandbox_usage, sandbox_usage.c.id)
    return conn.execute(statement, dataclasses.asdict(usage)).rowcount == 1


class SqlUsageStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # Every direct call writes one row before its answer goes out: one statement,
        # compiled once (SQLAlchemy's per-execution work cost more than the insert).
        self._record = insert_new(db.engine.dialect, sandbox_usage, sandbox_usage.c.id)

    def record(self, usage: SandboxUsage) -> bool:
        return self.db.write(self._record, dataclasses.asdict(usage)) == 1

    def totals(self, query: UsageQuery) -> list[BucketTotal]:
        t = sandbox_usage.c
        # Integer division by a positive width of a non-negative offset: the same floor on
        # SQLite and PostgreSQL.
        bucket = ((t.ended_at_ms - query.origin_ms) // query.width_ms).label("bucket")
        columns: list[Any] = [
            bucket,
            func.count(func.distinct(t.container_id)).label("sessions"),
            func.coalesce(func.sum(t.billed_ms), 0).label("billed_ms"),
            func.count().label("requests"),
        ]
        groups: list[Any] = [bucket]
        if query.by_project:
            columns.append(t.project)
            groups.append(t.project)
        where = [t.ended_at_ms >= query.start_ms, t.ended_at_ms < query.end_ms]
        if query.project_ids:
            where.append(t.project.in_(list(query.project_ids)))
        if query.api_key_ids:
            where.append(t.api_key_id.in_(list(query.api_key_ids)))
        stmt = select(*columns).where(*where).group_by(*groups).order_by(*groups)
        with self.db.connect() as conn:
            rows = conn.execute(stmt).all()
        return [
            BucketTotal(
                bucket=int(r.bucket),
                project=r.project if query.by_project else None,
                sessions=int(r.sessions),
                billed_ms=int(r.billed_ms),
                requests=int(r.requests),
            )
            for r in rows
        ]

    def get(self, usage_id: str) -> SandboxUsage | None:
        with self.db.connect() as conn:
            row = conn.execute(select(sandbox_usage).where(sandbox_usage.c.id == usage_id)).first()
        if row is None:
            return None
        m = row._mapping
        return SandboxUsage(
            id=m["id"],
            project=m["project"],
            api_key_id=m["api_key_id"],
            container_id=m["container_id"],
            kind=m["kind"],
            started_at_ms=m["started_at_ms"],
            ended_at_ms=m["ended_at_ms"],
            measured_ms=m["measured_ms"],
            billed_ms=m["billed_ms"],
            started_container=m["started_container"],
        )


class SqlStatsStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def containers_by_status(self) -> dict[str, int]:
        c = containers.c
        stmt = select(c.status, func.count()).where(c.deleted.is_(False)).group_by(c.status)
        with self.db.connect() as conn:
            return {str(status): int(n) for status, n in conn.execute(stmt)}

    def egress_decisions(self) -> dict[str, int]:
        e = egress_events.c
        stmt = select(e.decision, func.count()).group_by(e.decision)
        with self.db.connect() as conn:
            return {str(decision): int(n) for decision, n in conn.execute(stmt)}

    def billed_ms_by_project(self) -> dict[str, int]:
        u = sandbox_usage.c
        stmt = select(u.project, func.sum(u.billed_ms)).group_by(u.project)
        with self.db.connect() as conn:
            return {str(project): int(ms or 0) for project, ms in conn.execute(stmt)}
