"""Files API files and the index of container files (paths under /mnt/data -> stable ids)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import delete, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from shellbox.store.db import Database, Order
from shellbox.store.records import ContainerFileRecord, FileRecord
from shellbox.store.tables import container_files, files


class FileStore(Protocol):
    def insert(self, record: FileRecord) -> None: ...
    def get(self, project: str, file_id: str, *, now: int) -> FileRecord | None: ...
    def page(
        self,
        project: str,
        *,
        purpose: str | None,
        now: int,
        after: str | None,
        limit: int,
        order: Order,
    ) -> tuple[list[FileRecord], bool]: ...
    def delete(self, file_id: str) -> None: ...
    def purge_expired(self, now: int) -> list[str]: ...


class ContainerFileStore(Protocol):
    def for_container(self, cid: str) -> list[ContainerFileRecord]: ...
    def get(self, cid: str, file_id: str) -> ContainerFileRecord | None: ...
    def page(
        self, cid: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[ContainerFileRecord], bool]: ...
    def upsert(self, record: ContainerFileRecord, *, force_source: bool) -> ContainerFileRecord: ...
    def delete(self, ids: Sequence[str]) -> None: ...
    def delete_container(self, cid: str) -> None: ...


def _unexpired(now: int) -> Any:
    """Files past their ``expires_after`` are gone for the API (their rows stay until purged)."""
    return or_(files.c.expires_at.is_(None), files.c.expires_at > now)


class SqlFileStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert(self, record: FileRecord) -> None:
        with self.db.begin() as conn:
            conn.execute(
                insert(files).values(
                    id=record.id,
                    project=record.project,
                    filename=record.filename,
                    purpose=record.purpose,
                    bytes=record.bytes,
                    created_at=record.created_at,
                    expires_at=record.expires_at,
                )
            )

    def get(self, project: str, file_id: str, *, now: int) -> FileRecord | None:
        with self.db.connect() as conn:
            row = conn.execute(
                select(files).where(
                    files.c.id == file_id, files.c.project == project, _unexpired(now)
                )
            ).first()
        return None if row is None else FileRecord.from_row(row._mapping)

    def page(
        self,
        project: str,
        *,
        purpose: str | None,
        now: int,
        after: str | None,
        limit: int,
        order: Order,
    ) -> tuple[list[FileRecord], bool]:
        where = [files.c.project == project, _unexpired(now)]
        if purpose:
            where.append(files.c.purpose == purpose)
        page = self.db.page(files, where, after=after, limit=limit, order=order)
        return [FileRecord.from_row(r) for r in page.rows], page.has_more

    def delete(self, file_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(files).where(files.c.id == file_id))

    def purge_expired(self, now: int) -> list[str]:
        """Delete the rows of files expired by ``now``; returns their ids (for their bytes)."""
        with self.db.begin() as conn:
            ids = list(
                conn.scalars(
                    select(files.c.id).where(
                        files.c.expires_at.is_not(None), files.c.expires_at <= now
                    )
                )
            )
            if ids:
                conn.execute(delete(files).where(files.c.id.in_(ids)))
        return ids


class SqlContainerFileStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def for_container(self, cid: str) -> list[ContainerFileRecord]:
        with self.db.connect() as conn:
            rows = conn.execute(
                select(container_files).where(container_files.c.container_id == cid)
            ).all()
        return [ContainerFileRecord.from_row(r._mapping) for r in rows]

    def get(self, cid: str, file_id: str) -> ContainerFileRecord | None:
        with self.db.connect() as conn:
            row = conn.execute(
                select(container_files).where(
                    container_files.c.id == file_id, container_files.c.container_id == cid
                )
            ).first()
        return None if row is None else ContainerFileRecord.from_row(row._mapping)

    def page(
        self, cid: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[ContainerFileRecord], bool]:
        page = self.db.page(
            container_files,
            [container_files.c.container_id == cid],
            after=after,
            limit=limit,
            order=order,
        )
        return [ContainerFileRecord.from_row(r) for r in page.rows], page.has_more

    def upsert(self, record: ContainerFileRecord, *, force_source: bool) -> ContainerFileRecord:
        """Index a path: a new row, or the existing row of that path updated (keeping its id,
        creation time and, unless ``force_source``, its source). One statement on the
        ``(container_id, path)`` constraint, so two writers of one path cannot both insert."""
        with self.db.begin() as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            stmt = dialect.insert(container_files).values(
                id=record.id,
                container_id=record.container_id,
                path=record.path,
                bytes=record.bytes,
                mtime_ns=record.mtime_ns,
                created_at=record.created_at,
                source=record.source,
            )
            changes: dict[str, Any] = {
                "bytes": stmt.excluded.bytes,
                "mtime_ns": stmt.excluded.mtime_ns,
            }
            if force_source:
                changes["source"] = stmt.excluded.source
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[container_files.c.container_id, container_files.c.path],
                    set_=changes,
                )
            )
            row = conn.execute(
                select(container_files).where(
                    container_files.c.container_id == record.container_id,
                    container_files.c.path == record.path,
                )
            ).one()
        return ContainerFileRecord.from_row(row._mapping)

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            with self.db.begin() as conn:
                conn.execute(delete(container_files).where(container_files.c.id.in_(list(ids))))

    def delete_container(self, cid: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(container_files).where(container_files.c.container_id == cid))
