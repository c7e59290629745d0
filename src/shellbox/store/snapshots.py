"""Snapshots: their rows, the per-project count and bytes that taking one must respect, and
the rows of deleted snapshots whose bytes still count while forks of them live.

A snapshot deleted (or expired) while live containers were forked from it is *hidden*: its
row stays with ``deleted_at`` set, the API no longer shows it, and its ``bytes`` still count
against the project's snapshot bytes until no live container names it (``containers.
snapshot_id``). That is computed from the rows on every count, never kept as a counter, so it
holds across restarts and across servers sharing the database; ``released`` then lists the
rows nothing holds any more, for the service to drop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import and_, case, delete, exists, func, insert, or_, select, text, update
from sqlalchemy.engine import Connection

from shellbox.store.containers import LIVE_ROWS, project_lock_key
from shellbox.store.db import Database, Order
from shellbox.store.tables import containers, snapshots


@dataclass(frozen=True)
class SnapshotRecord:
    id: str
    project: str
    container_id: str
    name: str | None
    status: str  # "ready"
    bytes: int
    created_at: int
    last_used_at: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SnapshotRecord:
        return cls(
            id=row["id"],
            project=row["project"],
            container_id=row["container_id"],
            name=row["name"],
            status=row["status"],
            bytes=row["bytes"],
            created_at=row["created_at"],
            last_used_at=row["last_used_at"],
        )


@dataclass(frozen=True)
class SnapshotUsage:
    """What a project's snapshots hold: ``count`` listed ones; ``bytes`` theirs plus
    ``held_bytes``, those of deleted snapshots that live forks still use."""

    count: int
    bytes: int
    held_bytes: int


@dataclass(frozen=True)
class SnapshotQuota:
    max_count: int
    max_bytes: int


class SnapshotStore(Protocol):
    def get(self, project: str, snapshot_id: str) -> SnapshotRecord | None: ...
    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SnapshotRecord], bool]: ...
    def usage(self, project: str) -> SnapshotUsage: ...
    def insert_within(
        self, record: SnapshotRecord, quota: SnapshotQuota
    ) -> SnapshotUsage | None: ...
    def used(self, snapshot_id: str, at: int) -> None: ...
    def bytes_of(self, snapshot_id: str) -> int | None: ...
    def hide(self, snapshot_id: str, at: int) -> None: ...
    def unused_since(self, before: int) -> list[SnapshotRecord]: ...
    def released(self) -> list[str]: ...
    def remove(self, snapshot_id: str) -> None: ...
    def ids(self) -> list[str]: ...


_LISTED = snapshots.c.deleted_at.is_(None)
# A live container forked from the snapshot of the row in hand.
_FORKED = exists().where(containers.c.snapshot_id == snapshots.c.id, *LIVE_ROWS)


class SqlSnapshotStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, project: str, snapshot_id: str) -> SnapshotRecord | None:
        with self.db.connect() as conn:
            row = conn.execute(
                select(snapshots).where(
                    snapshots.c.id == snapshot_id, snapshots.c.project == project, _LISTED
                )
            ).first()
        return None if row is None else SnapshotRecord.from_row(row._mapping)

    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SnapshotRecord], bool]:
        found = self.db.page(
            snapshots,
            [snapshots.c.project == project, _LISTED],
            after=after,
            limit=limit,
            order=order,
        )
        return [SnapshotRecord.from_row(r) for r in found.rows], found.has_more

    def usage(self, project: str) -> SnapshotUsage:
        with self.db.connect() as conn:
            return self._usage(conn, project)

    @staticmethod
    def _usage(conn: Connection, project: str) -> SnapshotUsage:
        listed = case((_LISTED, 1), else_=0)
        held = case((_LISTED, 0), else_=snapshots.c.bytes)
        count, total, held_total = conn.execute(
            select(
                func.coalesce(func.sum(listed), 0),
                func.coalesce(func.sum(snapshots.c.bytes), 0),
                func.coalesce(func.sum(held), 0),
            ).where(snapshots.c.project == project, or_(_LISTED, _FORKED))
        ).one()
        return SnapshotUsage(int(count), int(total), int(held_total))

    def insert_within(self, record: SnapshotRecord, quota: SnapshotQuota) -> SnapshotUsage | None:
        """Insert the row if the project stays within ``quota`` with it (at most
        ``max_count`` listed snapshots, ``max_bytes`` counted); else insert nothing and
        return the usage that refused it. Counted and inserted under the same per-project
        lock as containers (``containers.insert_within``)."""
        with self.db.begin() as conn:
            if conn.dialect.name == "postgresql":
                key = project_lock_key(record.project)
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            usage = self._usage(conn, record.project)
            if usage.count >= quota.max_count or usage.bytes + record.bytes > quota.max_bytes:
                return usage
            conn.execute(
                insert(snapshots).values(
                    id=record.id,
                    project=record.project,
                    container_id=record.container_id,
                    name=record.name,
                    status=record.status,
                    bytes=record.bytes,
                    created_at=record.created_at,
                    last_used_at=record.last_used_at,
                    deleted_at=None,
                )
            )
        return None

    def used(self, snapshot_id: str, at: int) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(snapshots)
                .where(snapshots.c.id == snapshot_id, snapshots.c.last_used_at < at)
                .values(last_used_at=at)
            )

    def bytes_of(self, snapshot_id: str) -> int | None:
        """A snapshot's bytes, hidden or not (a live fork's snapshot always has its row)."""
        with self.db.connect() as conn:
            found = conn.execute(
                select(snapshots.c.bytes).where(snapshots.c.id == snapshot_id)
            ).scalar()
        return None if found is None else int(found)

    def hide(self, snapshot_id: str, at: int) -> None:
        """Deleted from the API: no longer listed, found or forked; its row stays until
        ``released`` names it."""
        with self.db.begin() as conn:
            conn.execute(
                update(snapshots)
                .where(snapshots.c.id == snapshot_id, _LISTED)
                .values(deleted_at=at)
            )

    def unused_since(self, before: int) -> list[SnapshotRecord]:
        """Listed snapshots of every project last used (taken or forked) before ``before``."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(snapshots)
                .where(_LISTED, snapshots.c.last_used_at < before)
                .order_by(snapshots.c.seq)
            )
            return [SnapshotRecord.from_row(r._mapping) for r in rows]

    def released(self) -> list[str]:
        """Hidden snapshots no live container was forked from: nothing counts them now."""
        with self.db.connect() as conn:
            return list(conn.scalars(select(snapshots.c.id).where(and_(~_LISTED, ~_FORKED))))

    def remove(self, snapshot_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(snapshots).where(snapshots.c.id == snapshot_id))

    def ids(self) -> list[str]:
        """Every listed snapshot (of every project): the ones whose storage is kept."""
        with self.db.connect() as conn:
            return list(conn.scalars(select(snapshots.c.id).where(_LISTED)))
