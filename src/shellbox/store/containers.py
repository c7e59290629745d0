"""Containers: their rows, and the per-project cap that creating one must respect."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import BigInteger, bindparam, case, func, insert, select, text, update

from shellbox.store.db import Database, Order
from shellbox.store.records import LIVE, ContainerRecord, ContainerStatus
from shellbox.store.tables import containers


@dataclass(frozen=True)
class Quota:
    max_containers: int
    max_memory_bytes: int
    memory_bytes: dict[str, int]  # memory_limit -> bytes


@dataclass(frozen=True)
class Usage:
    """A project's live containers, by memory limit."""

    counts: dict[str, int]

    @property
    def containers(self) -> int:
        return sum(self.counts.values())

    def memory_bytes(self, sizes: dict[str, int]) -> int:
        return sum(sizes[m] * n for m, n in self.counts.items())


class ContainerStore(Protocol):
    def get(self, project: str, cid: str) -> ContainerRecord | None: ...
    def page(
        self, project: str, *, name: str | None, after: str | None, limit: int, order: Order
    ) -> tuple[list[ContainerRecord], bool]: ...
    def usage(self, project: str) -> Usage: ...
    def insert_within(self, record: ContainerRecord, quota: Quota) -> Usage | None: ...
    def remove(self, cid: str) -> None: ...
    def set_status(self, cid: str, status: ContainerStatus, *, deleted: bool = False) -> None: ...
    def transition(
        self,
        cid: str,
        status: ContainerStatus,
        *,
        expected: Sequence[ContainerStatus],
        idle_since: int,
    ) -> bool: ...
    def touch(self, activity: Iterable[tuple[str, int]]) -> None: ...
    def live(self) -> list[ContainerRecord]: ...
    def all(self) -> list[ContainerRecord]: ...
    def by_ids(self, ids: Sequence[str]) -> list[ContainerRecord]: ...
    def ids(self) -> list[str]: ...
    def live_skills(self) -> list[tuple[str, list[dict[str, Any]]]]: ...
    def with_secrets(self) -> list[tuple[str, Any]]: ...
    def set_secrets(self, cid: str, secrets: list[dict[str, Any]]) -> None: ...
    def scrub(self) -> None: ...


def project_lock_key(project: str) -> int:
    """A stable 64-bit key for PostgreSQL's advisory lock on one project's containers."""
    return int.from_bytes(hashlib.sha256(project.encode()).digest()[:8], "big", signed=True)


LIVE_ROWS = (containers.c.status.in_(LIVE), containers.c.deleted.is_(False))
# Built once: on every call's path, and building the expression costs about what running it
# does.
_GET = select(containers).where(
    containers.c.id == bindparam("b_id"),
    containers.c.project == bindparam("b_project"),
    containers.c.deleted.is_(False),
)


class SqlContainerStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, project: str, cid: str) -> ContainerRecord | None:
        """One indexed read (every call makes it: see ``ContainerService._claim``)."""
        row = self.db.first_row(_GET, {"b_id": cid, "b_project": project})
        return None if row is None else ContainerRecord.from_row(row)

    def page(
        self, project: str, *, name: str | None, after: str | None, limit: int, order: Order
    ) -> tuple[list[ContainerRecord], bool]:
        where = [containers.c.project == project, containers.c.deleted.is_(False)]
        if name is not None:
            where.append(containers.c.name == name)
        page = self.db.page(containers, where, after=after, limit=limit, order=order)
        return [ContainerRecord.from_row(r) for r in page.rows], page.has_more

    def usage(self, project: str) -> Usage:
        with self.db.connect() as conn:
            return self._usage(conn, project)

    @staticmethod
    def _usage(conn: Any, project: str) -> Usage:
        rows = conn.execute(
            select(containers.c.memory_limit, func.count())
            .where(containers.c.project == project, *LIVE_ROWS)
            .group_by(containers.c.memory_limit)
        ).all()
        return Usage({m: n for m, n in rows})

    def insert_within(self, record: ContainerRecord, quota: Quota) -> Usage | None:
        """Insert the row if the project stays within ``quota`` with it; else insert nothing
        and return the usage that refused it. Counting and inserting are one transaction
        under a per-project lock (PostgreSQL: an advisory lock; SQLite: the database's one
        writer lock, taken up front), so two servers cannot both take the last place."""
        with self.db.begin() as conn:
            if conn.dialect.name == "postgresql":
                key = project_lock_key(record.project)
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
            else:
                # Take SQLite's write lock before counting: a second writer waits here
                # instead of counting rows the first is about to add.
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            usage = self._usage(conn, record.project)
            want = quota.memory_bytes[record.memory_limit]
            if (
                usage.containers >= quota.max_containers
                or usage.memory_bytes(quota.memory_bytes) + want > quota.max_memory_bytes
            ):
                return usage
            conn.execute(
                insert(containers).values(
                    id=record.id,
                    project=record.project,
                    name=record.name,
                    status=record.status,
                    created_at=record.created_at,
                    last_active_at=record.last_active_at,
                    expires_after_minutes=record.expires_after_minutes,
                    memory_limit=record.memory_limit,
                    network_policy=record.network_policy,
                    secrets=record.secrets or None,
                    skills=record.skills or None,
                    deleted=False,
                    snapshot_id=record.snapshot_id,
                )
            )
        return None

    def remove(self, cid: str) -> None:
        with self.db.begin() as conn:
            conn.execute(containers.delete().where(containers.c.id == cid))

    def set_status(self, cid: str, status: ContainerStatus, *, deleted: bool = False) -> None:
        values: dict[str, Any] = {"status": status}
        if deleted:
            values["deleted"] = True
        with self.db.begin() as conn:
            conn.execute(update(containers).where(containers.c.id == cid).values(**values))

    def transition(
        self,
        cid: str,
        status: ContainerStatus,
        *,
        expected: Sequence[ContainerStatus],
        idle_since: int,
    ) -> bool:
        """Move the container to ``status`` if it is in one of ``expected`` and has seen no
        activity after ``idle_since``; whether it did. One conditional statement: of two
        processes putting one container to sleep (or expiring it) at once, one does it."""
        with self.db.begin() as conn:
            done = conn.execute(
                update(containers)
                .where(
                    containers.c.id == cid,
                    containers.c.status.in_(list(expected)),
                    containers.c.deleted.is_(False),
                    containers.c.last_active_at <= idle_since,
                )
                .values(status=status)
            )
        return bool(done.rowcount)

    def touch(self, activity: Iterable[tuple[str, int]]) -> None:
        """Renew last_active_at; never moves it back (another server may have seen a later
        call than the one this server reports)."""
        params = [{"b_id": cid, "b_at": at} for cid, at in activity]
        if not params:
            return
        at = bindparam("b_at", type_=BigInteger)
        with self.db.begin() as conn:
            conn.execute(
                update(containers)
                .where(containers.c.id == bindparam("b_id"))
                .values(
                    last_active_at=case(
                        (containers.c.last_active_at < at, at),
                        else_=containers.c.last_active_at,
                    )
                ),
                params,
            )

    def _select(self, *where: Any) -> list[ContainerRecord]:
        with self.db.connect() as conn:
            rows = conn.execute(select(containers).where(*where).order_by(containers.c.seq))
            return [ContainerRecord.from_row(r._mapping) for r in rows]

    def live(self) -> list[ContainerRecord]:
        return self._select(*LIVE_ROWS)

    def all(self) -> list[ContainerRecord]:
        return self._select()

    def by_ids(self, ids: Sequence[str]) -> list[ContainerRecord]:
        return self._select(containers.c.id.in_(list(ids))) if ids else []

    def ids(self) -> list[str]:
        with self.db.connect() as conn:
            return list(conn.scalars(select(containers.c.id)))

    def live_skills(self) -> list[tuple[str, list[dict[str, Any]]]]:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(containers.c.id, containers.c.skills).where(
                    *LIVE_ROWS, containers.c.skills.is_not(None)
                )
            ).all()
        # (a JSON null passes ``IS NOT NULL``: rows without skills are dropped here)
        return [(cid, entries) for cid, entries in rows if entries]

    def with_secrets(self) -> list[tuple[str, Any]]:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(containers.c.id, containers.c.secrets).where(
                    containers.c.secrets.is_not(None)
                )
            ).all()
        return [(cid, secrets) for cid, secrets in rows if secrets]

    def set_secrets(self, cid: str, secrets: list[dict[str, Any]]) -> None:
        with self.db.begin() as conn:
            conn.execute(update(containers).where(containers.c.id == cid).values(secrets=secrets))

    def scrub(self) -> None:
        """Leave none of the values ``set_secrets`` replaced behind in the database files."""
        self.db.scrub()
