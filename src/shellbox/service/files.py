"""The Files API (blobs a project uploads) and container files (what lives in /mnt/data).

Container files are indexed lazily: the table maps a path under ``/mnt/data`` to a stable
``cfile_`` id. Files uploaded through the API are ``source: "user"``; files that commands
create are found by scanning the data directory and are ``source: "assistant"``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from sqlalchemy import delete, insert, select, update

from shellbox.errors import FileNotFound, InvalidRequest, PayloadTooLarge
from shellbox.ids import new_id
from shellbox.sandbox.oci import SANDBOX_UID, host_uid
from shellbox.service import fs
from shellbox.service.containers import ContainerService
from shellbox.service.models import ContainerFileRecord, FileRecord, Principal
from shellbox.settings import Settings
from shellbox.store import Database
from shellbox.store.tables import container_files, files

FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


class UploadStream:
    """An upload's bytes, counted against the size cap while they arrive."""

    def __init__(self, chunks: AsyncIterator[bytes] | Iterator[bytes], cap: int) -> None:
        self.chunks = chunks
        self.cap = cap


def _check_size(size: int, cap: int) -> None:
    if size > cap:
        msg = f"the upload is larger than the {cap} byte limit of this server"
        raise PayloadTooLarge(msg, param="file")


class FileService:
    def __init__(self, settings: Settings, db: Database, containers: ContainerService) -> None:
        self.settings = settings
        self.db = db
        self.containers = containers
        self.blob_dir = settings.state_dir / "files"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        containers.copy_files = self.copy_into_container

    # -- Files API --------------------------------------------------------------------------

    def _blob(self, file_id: str) -> Path:
        return self.blob_dir / file_id

    def create_file(
        self,
        principal: Principal,
        filename: str,
        purpose: str,
        src: Path,
        size: int,
        expires_after_seconds: int | None = None,
    ) -> FileRecord:
        """Register an uploaded file whose bytes are in ``src`` (moved into the store)."""
        if purpose not in FILE_PURPOSES:
            msg = f"purpose must be one of {', '.join(FILE_PURPOSES)}"
            raise InvalidRequest(msg, param="purpose")
        _check_size(size, self.settings.limits.upload_max_bytes)
        now = int(time.time())
        record = FileRecord(
            new_id("file-"),
            principal.project,
            os.path.basename(filename) or "upload",
            purpose,
            size,
            now,
            now + expires_after_seconds if expires_after_seconds else None,
        )
        os.replace(src, self._blob(record.id))
        with self.db.begin() as conn:
            conn.execute(
                insert(files).values(
                    id=record.id,
                    project=record.project,
                    filename=record.filename,
                    purpose=purpose,
                    bytes=size,
                    created_at=now,
                    expires_at=record.expires_at,
                )
            )
        return record

    def temp_path(self) -> Path:
        return self.blob_dir / f".upload-{new_id('')}"

    def get_file(self, principal: Principal, file_id: str) -> FileRecord:
        with self.db.connect() as conn:
            row = conn.execute(
                select(files).where(files.c.id == file_id, files.c.project == principal.project)
            ).first()
        if row is None:
            msg = f"No file found with id '{file_id}'."
            raise FileNotFound(msg, param="file_id")
        return FileRecord.from_row(row._mapping)

    def list_files(
        self,
        principal: Principal,
        *,
        after: str | None,
        limit: int,
        order: str,
        purpose: str | None = None,
    ) -> tuple[list[FileRecord], bool]:
        where = [files.c.project == principal.project]
        if purpose:
            where.append(files.c.purpose == purpose)
        page = self.db.page(
            files, where, after=after, limit=limit, order="asc" if order == "asc" else "desc"
        )
        return [FileRecord.from_row(r) for r in page.rows], page.has_more

    def file_content(self, principal: Principal, file_id: str) -> Path:
        self.get_file(principal, file_id)
        return self._blob(file_id)

    def delete_file(self, principal: Principal, file_id: str) -> None:
        self.get_file(principal, file_id)
        with self.db.begin() as conn:
            conn.execute(delete(files).where(files.c.id == file_id))
        self._blob(file_id).unlink(missing_ok=True)

    # -- container files --------------------------------------------------------------------

    async def copy_into_container(
        self, principal: Principal, cid: str, file_ids: list[str]
    ) -> None:
        records = [self.get_file(principal, fid) for fid in file_ids]
        for record in records:
            self._put(cid, record.filename, _read_blob(self._blob(record.id)))

    def upload(
        self, principal: Principal, cid: str, filename: str, chunks: Iterator[bytes]
    ) -> ContainerFileRecord:
        self.containers.get(principal, cid)
        rel = fs.relative_path(filename, param="file")
        record = self._put(cid, rel, _capped(chunks, self.settings.limits.upload_max_bytes))
        self.containers.touch(cid)
        return record

    def upload_from_file(self, principal: Principal, cid: str, file_id: str) -> ContainerFileRecord:
        self.containers.get(principal, cid)
        record = self.get_file(principal, file_id)
        out = self._put(cid, record.filename, _read_blob(self._blob(record.id)))
        self.containers.touch(cid)
        return out

    def _put(self, cid: str, filename: str, chunks: Iterator[bytes]) -> ContainerFileRecord:
        rel = fs.relative_path(filename, param="file")
        root = self.containers.data_dir(cid)
        fs.write_file(root, rel, chunks, uid=host_uid(SANDBOX_UID))
        st = fs.stat_file(root, rel)
        if st is None:  # replaced from inside the sandbox in the meantime
            msg = f"/mnt/data/{rel} changed while it was being written"
            raise InvalidRequest(msg, param="file")
        return self._index(cid, rel, st.st_size, st.st_mtime_ns, source="user", force_source=True)

    def _index(
        self,
        cid: str,
        rel: str,
        size: int,
        mtime_ns: int,
        *,
        source: str,
        force_source: bool = False,
    ) -> ContainerFileRecord:
        now = int(time.time())
        with self.db.begin() as conn:
            row = conn.execute(
                select(container_files).where(
                    container_files.c.container_id == cid, container_files.c.path == rel
                )
            ).first()
            if row is None:
                fid = new_id("cfile_")
                conn.execute(
                    insert(container_files).values(
                        id=fid,
                        container_id=cid,
                        path=rel,
                        bytes=size,
                        mtime_ns=mtime_ns,
                        created_at=now,
                        source=source,
                    )
                )
                return ContainerFileRecord(fid, cid, rel, size, now, source, mtime_ns)
            values: dict[str, object] = {"bytes": size, "mtime_ns": mtime_ns}
            if force_source:
                values["source"] = source
            conn.execute(
                update(container_files).where(container_files.c.id == row.id).values(**values)
            )
            return ContainerFileRecord(
                row.id,
                cid,
                rel,
                size,
                row.created_at,
                source if force_source else row.source,
                mtime_ns,
            )

    def sync(self, cid: str) -> list[ContainerFileRecord]:
        """Bring the index in line with the data directory; returns files changed since."""
        entries = {e.path: e for e in fs.scan(self.containers.data_dir(cid))}
        with self.db.connect() as conn:
            rows = conn.execute(
                select(container_files).where(container_files.c.container_id == cid)
            ).all()
        known = {r.path: r for r in rows}
        gone = [r.id for p, r in known.items() if p not in entries]
        if gone:
            with self.db.begin() as conn:
                conn.execute(delete(container_files).where(container_files.c.id.in_(gone)))
        changed = []
        for path, entry in entries.items():
            row = known.get(path)
            if row is None or row.mtime_ns != entry.mtime_ns or row.bytes != entry.size:
                changed.append(
                    self._index(cid, path, entry.size, entry.mtime_ns, source="assistant")
                )
        return changed

    def list_container_files(
        self, principal: Principal, cid: str, *, after: str | None, limit: int, order: str
    ) -> tuple[list[ContainerFileRecord], bool]:
        self.containers.get(principal, cid)
        self.sync(cid)
        page = self.db.page(
            container_files,
            [container_files.c.container_id == cid],
            after=after,
            limit=limit,
            order="asc" if order == "asc" else "desc",
        )
        return [ContainerFileRecord.from_row(r) for r in page.rows], page.has_more

    def get_container_file(
        self, principal: Principal, cid: str, file_id: str
    ) -> ContainerFileRecord:
        self.containers.get(principal, cid)
        with self.db.connect() as conn:
            row = conn.execute(
                select(container_files).where(
                    container_files.c.id == file_id, container_files.c.container_id == cid
                )
            ).first()
        if row is None:
            msg = f"No file found with id '{file_id}' in container {cid}."
            raise FileNotFound(msg, param="file_id")
        return ContainerFileRecord.from_row(row._mapping)

    def open_container_file(self, principal: Principal, cid: str, file_id: str) -> Iterator[bytes]:
        record = self.get_container_file(principal, cid, file_id)
        fd = fs.open_read(self.containers.data_dir(cid), record.path)
        self.containers.touch(cid)
        return fs.read_chunks(fd)

    def delete_container_file(self, principal: Principal, cid: str, file_id: str) -> None:
        record = self.get_container_file(principal, cid, file_id)
        with contextlib.suppress(FileNotFound):
            fs.delete(self.containers.data_dir(cid), record.path)
        with self.db.begin() as conn:
            conn.execute(delete(container_files).where(container_files.c.id == file_id))
        self.containers.touch(cid)


def _read_blob(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while data := f.read(1 << 16):
            yield data


def _capped(chunks: Iterator[bytes], cap: int) -> Iterator[bytes]:
    total = 0
    for data in chunks:
        total += len(data)
        _check_size(total, cap)
        yield data
