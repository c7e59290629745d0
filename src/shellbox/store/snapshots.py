"""Snapshots: their rows, and the per-project count that taking one must respect."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select, text, update

from shellbox.store.containers import project_lock_key
from shellbox.store.db import Database, Order
from shellbox.store.tables import snapshots


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


class SnapshotStore(Protocol):
    def get(self, project: str, snapshot_id: str) -> SnapshotRecord | None: ...
    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SnapshotRecord], bool]: ...
    def insert_within(self, record: SnapshotRecord, max_per_project: int) -> int | None: ...
    def used(self, snapshot_id: str, at: int) -> None: ...
    def remove(self, snapshot_id: str) -> None: ...
    def ids(self) -> list[str]: ...


class SqlSnapshotStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, project: str, snapshot_id: str) -> SnapshotRecord | None:
        with self.db.connect() as conn:
            row = conn.execute(
                select(snapshots).where(
                    snapshots.c.id == snapshot_id, snapshots.c.project == project
                )
            ).first()
        return None if row is None else SnapshotRecord.from_row(row._mapping)

    def page(
        self, project: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SnapshotRecord], bool]:
        found = self.db.page(
            snapshots, [snapshots.c.project == project], after=after, limit=limit, order=order
        )
        return [SnapshotRecord.from_row(r) for r in found.rows], found.has_more

    def insert_within(self, record: SnapshotRecord, max_per_project: int) -> int | None:
        """Insert the row if the project keeps at most ``max_per_project`` snapshots with it;
        else insert nothing and return how many it has. Counted and inserted under the same
        per-project lock as containers (``containers.insert_within``)."""
        with self.db.begin() as conn:
            if conn.dialect.name == "postgresql":
                key = project_lock_key(record.project)
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            count = conn.execute(
                select(func.count())
                .select_from(snapshots)
                .where(snapshots.c.project == record.project)
            ).scalar_one()
            if count >= max_per_project:
                return int(count)
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

    def remove(self, snapshot_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(snapshots).where(snapshots.c.id == snapshot_id))

    def ids(self) -> list[str]:
        with self.db.connect() as conn:
            return [r[0] for r in conn.execute(select(snapshots.c.id))]
