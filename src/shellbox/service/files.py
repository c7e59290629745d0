"""The Files API (blobs a project uploads) and container files (what lives in /mnt/data).

Container files are indexed lazily: the table maps a path under ``/mnt/data`` to a stable
``cfile_`` id. Files uploaded through the API are ``source: "user"``; files that commands
create are found by scanning the data directory and are ``source: "assistant"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio

from shellbox.errors import FileNotFound, InvalidRequest, PayloadTooLarge
from shellbox.features import ContainerFeature
from shellbox.ids import new_id
from shellbox.sandbox import FileInfo
from shellbox.sandbox.datapath import DATA_MOUNT, check_name_limits, relative_path
from shellbox.service.containers import ContainerService
from shellbox.service.models import ContainerFileRecord, ContainerRecord, FileRecord, Principal
from shellbox.settings import Settings
from shellbox.store import ContainerFileStore, FileStore
from shellbox.store.blobs import BlobStore, FsBlobStore

log = logging.getLogger("shellbox.files")
STALE_UPLOAD_S = 3600  # a temporary upload file untouched this long was left by a crash
FILE_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


@dataclass(frozen=True)
class ChangeMark:
    """Where a call started, for ``FileService.changed_since``: this process's change count,
    and with a shared index the container's rows then, by path."""

    seq: int
    rows: dict[str, ContainerFileRecord] | None = None


def _check_size(size: int, cap: int) -> None:
    if size > cap:
        msg = f"the upload is larger than the {cap} byte limit of this server"
        raise PayloadTooLarge(msg, param="file")


class FileService(ContainerFeature):
    def __init__(
        self,
        settings: Settings,
        files: FileStore,
        container_files: ContainerFileStore,
        containers: ContainerService,
        blobs: BlobStore | None = None,
        *,
        shared_index: bool = False,
    ) -> None:
        self.settings = settings
        self.store = files
        self.index_store = container_files
        self.containers = containers
        # Uploads are received here (``temp_path``) and then kept by ``blobs``: by default
        # files in this same directory (one machine), else the database (API replicas).
        self.blob_dir = settings.state_dir / "files"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        self.blobs: BlobStore = blobs or FsBlobStore(self.blob_dir)
        # API replicas: other processes index the same containers' files, so each sync starts
        # from the rows (one query), not from what this process saw last.
        self.shared_index = shared_index
        containers.copy_files = self.copy_into_container
        self._next_purge = 0.0
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._known: dict[str, dict[str, ContainerFileRecord]] = {}
        self._scan_locks: dict[str, asyncio.Lock] = {}
        # Every change the index records gets the next number of this counter; a call cites
        # the files whose number is past the mark taken when it started. File times cannot do
        # this: the kernel stamps some writes from a coarse clock and some from a fine one, so
        # a file written just before a call can look newer than the call's start.
        self._change_seq = 0
        self._changed_at: dict[str, dict[str, int]] = {}  # container -> path -> change number

    # -- start-up -----------------------------------------------------------------------------

    def start(self, *, sweep_containers: bool = True) -> None:
        """Remove what uploads cut off by a crash left: the Files API's temporaries at once
        (one directory, and no upload is in flight before the server listens), and every
        container's ``.shellbox-upload-*`` in a worker thread in the background, so that
        start-up does not wait for a walk of every data directory (``Runtime.sweep_uploads``
        keeps the temporaries of uploads this process starts meanwhile). An API replica
        leaves the containers' to their nodes (``sweep_containers=False``)."""
        for tmp in self.blob_dir.glob(".upload-*"):
            tmp.unlink(missing_ok=True)
        if not sweep_containers:
            return
        ids = self.containers.store.ids()
        if ids:
            self._sweeper = asyncio.create_task(self._sweep(ids), name="shellbox-upload-sweep")

    async def _sweep(self, ids: list[str]) -> None:
        started = time.monotonic()
        removed = 0
        for cid in ids:
            if self._stopping:
                break
            try:
                removed += await self.containers.runtime.sweep_uploads(cid)
            except OSError:
                log.exception("could not sweep upload leftovers of %s", cid)
        log.info(
            "upload leftovers: removed %d in %d containers in %.1f s",
            removed,
            len(ids),
            time.monotonic() - started,
        )

    async def close(self) -> None:
        self._stopping = True  # the sweep stops after the container it is sweeping
        if self._sweeper is not None:
            await self._sweeper

    # -- Files API --------------------------------------------------------------------------

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
        name = _safe_basename(filename)
        # The name becomes a file name in /mnt/data (file_ids): refuse now what would fail then.
        check_name_limits(name, shown=filename, param="file")
        now = int(time.time())
        record = FileRecord(
            new_id("file-"),
            principal.project,
            name,
            purpose,
            size,
            now,
            now + expires_after_seconds if expires_after_seconds else None,
        )
        self.blobs.put(record.id, src)
        try:
            self.store.insert(record)
        except BaseException:
            self.blobs.delete([record.id])
            raise
        return record

    def temp_path(self) -> Path:
        return self.blob_dir / f".upload-{new_id('')}"

    def get_file(self, principal: Principal, file_id: str) -> FileRecord:
        record = self.store.get(principal.project, file_id, now=int(time.time()))
        if record is None:
            msg = f"No file found with id '{file_id}'."
            raise FileNotFound(msg, param="file_id")
        return record

    def list_files(
        self,
        principal: Principal,
        *,
        after: str | None,
        limit: int,
        order: str,
        purpose: str | None = None,
    ) -> tuple[list[FileRecord], bool]:
        return self.store.page(
            principal.project,
            purpose=purpose,
            now=int(time.time()),
            after=after,
            limit=limit,
            order="asc" if order == "asc" else "desc",
        )

    def file_content(self, principal: Principal, file_id: str) -> Iterator[bytes]:
        self.get_file(principal, file_id)
        return self._open_blob(file_id)

    def _open_blob(self, file_id: str) -> Iterator[bytes]:
        """Opened at once: one purged before is a 404, not a failure half-way through."""
        blob = self.blobs.open(file_id)
        if blob is None:
            msg = f"No file found with id '{file_id}'."
            raise FileNotFound(msg, param="file_id")
        return blob.chunks

    def delete_file(self, principal: Principal, file_id: str) -> None:
        self.get_file(principal, file_id)
        self.store.delete(file_id)
        self.blobs.delete([file_id])

    async def housekeep(self) -> None:
        """Delete Files API files past their ``expires_after`` (rows and bytes), and uploads
        a crash left half-written; each reaper round, at most once per files_purge_interval_s."""
        now = time.time()
        if now < self._next_purge:
            return
        self._next_purge = now + self.settings.lifecycle.files_purge_interval_s
        ids = self.store.purge_expired(int(now))

        def unlink() -> None:
            self.blobs.delete(ids)
            for tmp in self.blob_dir.glob(".upload-*"):
                with contextlib.suppress(OSError):
                    if tmp.stat().st_mtime < now - STALE_UPLOAD_S:
                        tmp.unlink()

        await anyio.to_thread.run_sync(unlink)
        if ids:
            log.info("deleted %d expired files", len(ids))

    # -- container files --------------------------------------------------------------------

    async def copy_into_container(
        self, principal: Principal, cid: str, file_ids: list[str]
    ) -> None:
        records = [self.get_file(principal, fid) for fid in file_ids]
        for record in records:
            await self._write(cid, record.filename, self._blob_chunks(record), "file_ids")
            await self._index_written(cid, record.filename)

    async def upload(
        self, principal: Principal, cid: str, filename: str, chunks: Iterator[bytes]
    ) -> ContainerFileRecord:
        """Write an uploaded file (its name is the path under /mnt/data) into the container."""
        rel = relative_path(filename, param="file")
        async with self.containers.activity(principal, cid, wake=False):
            capped = _capped(chunks, self.settings.limits.upload_max_bytes)
            await self._write(cid, rel, capped, "file")
            return await self._index_written(cid, rel)

    async def upload_from_file(
        self, principal: Principal, cid: str, file_id: str
    ) -> ContainerFileRecord:
        async with self.containers.activity(principal, cid, wake=False):
            record = self.get_file(principal, file_id)
            await self._write(cid, record.filename, self._blob_chunks(record), "file_id")
            return await self._index_written(cid, record.filename)

    def _blob_chunks(self, record: FileRecord) -> Iterator[bytes]:
        return self._open_blob(record.id)

    async def _write(self, cid: str, filename: str, chunks: Iterator[bytes], param: str) -> None:
        rel = relative_path(filename, param=param)
        await self.containers.runtime.write_file(cid, rel, chunks, param=param)

    async def _index_written(self, cid: str, filename: str) -> ContainerFileRecord:
        rel = relative_path(filename, param="file")
        st = await self.containers.runtime.stat_file(cid, rel)
        if st is None:  # replaced from inside the sandbox in the meantime
            msg = f"{DATA_MOUNT}/{rel} changed while it was being written"
            raise InvalidRequest(msg, param="file")
        return self._index(cid, rel, st.size, st.mtime_ns, source="user", force_source=True)

    def _known_files(self, cid: str) -> dict[str, ContainerFileRecord]:
        """The index of one container's files by path, read from the database once and then
        kept in step with it here: every call syncs the index, and comparing a directory scan
        with memory costs microseconds where re-reading the rows cost a query per call. All
        writes to ``container_files`` from this process go through this service. Another
        server on the same database may index the same container: every write is an upsert
        on (container, path) that keeps the stored id, so a stale entry here costs a rewrite
        of the row, never a second id for one path (and lists and lookups read the rows)."""
        known = self._known.get(cid)
        if known is None:
            known = {r.path: r for r in self.index_store.for_container(cid)}
            self._known[cid] = known
        return known

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
        known = self._known_files(cid)
        fresh = ContainerFileRecord(
            new_id("cfile_"), cid, rel, size, int(time.time()), source, mtime_ns
        )
        record = self.index_store.upsert(fresh, force_source=force_source)
        known[rel] = record
        self._change_seq += 1
        self._changed_at.setdefault(cid, {})[rel] = self._change_seq
        return record

    async def sync(
        self, cid: str, *, rows: dict[str, ContainerFileRecord] | None = None
    ) -> list[ContainerFileRecord]:
        """Bring the index in line with the data directory; returns files changed since.

        One listing per container at a time, so a slow old one never undoes a newer one.
        With a shared index the listing is compared with the container's rows: ``rows`` when
        the caller read them already (a call's ``change_mark``), else read again here.
        """
        lock = self._scan_locks.setdefault(cid, asyncio.Lock())
        async with lock:
            found = await self.containers.runtime.list_files(cid)
            if self.shared_index:
                if rows is None:
                    self._known.pop(cid, None)  # read again from the rows
                else:
                    self._known[cid] = dict(rows)
            return self._apply_scan(cid, found)

    def _apply_scan(self, cid: str, found: list[FileInfo]) -> list[ContainerFileRecord]:
        entries = {e.path: e for e in found}
        known = self._known_files(cid)
        gone = [p for p in known if p not in entries]
        if gone:
            self.index_store.delete([known[p].id for p in gone])
            stamps = self._changed_at.get(cid, {})
            for p in gone:
                del known[p]
                stamps.pop(p, None)
        changed = []
        for path, entry in entries.items():
            old = known.get(path)
            if old is None or old.mtime_ns != entry.mtime_ns or old.bytes != entry.size:
                changed.append(
                    self._index(cid, path, entry.size, entry.mtime_ns, source="assistant")
                )
        return changed

    def change_mark(self, cid: str) -> ChangeMark:
        """A mark for ``changed_since``: changes recorded after this call are past it.

        One process indexing alone counts its own changes (no query). API replicas share the
        index, and another replica's listing may index a file while this replica's call
        runs, so that a sync at the end that read the rows again would find nothing new: the
        mark is then what the rows said at the start (one query), and the call cites what
        differs from it."""
        if not self.shared_index:
            return ChangeMark(self._change_seq)
        rows = self.index_store.for_container(cid)
        return ChangeMark(self._change_seq, {r.path: r for r in rows})

    async def changed_since(self, cid: str, mark: ChangeMark) -> list[ContainerFileRecord]:
        """Files under /mnt/data the index saw created or changed after ``mark`` (from
        ``change_mark``), newest first: what this sync finds changed (even with an old mtime,
        as ``cp -p`` or ``tar x`` leave), plus what a concurrent sync already indexed.

        With a shared index the sync starts from the mark's rows rather than reading them
        again (one read per call, not two): a file another replica indexed meanwhile differs
        from the mark, so this sync writes its row again (an upsert that keeps its id) and
        cites it. What that costs: a file another replica indexed during the call and that
        is gone again by this sync keeps its row until the next sync that reads the rows (the
        next call's, or a listing's)."""
        await self.sync(cid, rows=mark.rows)
        known = self._known_files(cid)
        if mark.rows is not None:
            before = mark.rows
            found = [
                f
                for p, f in known.items()
                if p not in before or (before[p].mtime_ns, before[p].bytes) != (f.mtime_ns, f.bytes)
            ]
        else:
            stamps = self._changed_at.get(cid, {})
            found = [known[p] for p, seq in stamps.items() if seq > mark.seq and p in known]
        return sorted(found, key=lambda f: (f.mtime_ns, f.id), reverse=True)

    async def release(self, record: ContainerRecord) -> None:
        """A container ended (expired or deleted): its files are gone, and so is their index."""
        self.forget(record.id)
        self.index_store.delete_container(record.id)

    def remembered(self) -> set[str]:
        return set(self._known) | set(self._changed_at) | set(self._scan_locks)

    def forget(self, cid: str) -> None:
        self._known.pop(cid, None)
        self._changed_at.pop(cid, None)
        self._scan_locks.pop(cid, None)

    async def list_container_files(
        self, principal: Principal, cid: str, *, after: str | None, limit: int, order: str
    ) -> tuple[list[ContainerFileRecord], bool]:
        self.containers.get(principal, cid)
        await self.sync(cid)
        return self.index_store.page(
            cid, after=after, limit=limit, order="asc" if order == "asc" else "desc"
        )

    def get_container_file(
        self, principal: Principal, cid: str, file_id: str
    ) -> ContainerFileRecord:
        self.containers.get(principal, cid)
        record = self.index_store.get(cid, file_id)
        if record is None:
            msg = f"No file found with id '{file_id}' in container {cid}."
            raise FileNotFound(msg, param="file_id")
        return record

    async def open_container_file(
        self, principal: Principal, cid: str, file_id: str
    ) -> AsyncIterator[bytes]:
        record = self.get_container_file(principal, cid, file_id)
        chunks = await self.containers.runtime.read_file(cid, record.path)
        self.containers.touch(cid)
        return chunks

    async def delete_container_file(self, principal: Principal, cid: str, file_id: str) -> None:
        record = self.get_container_file(principal, cid, file_id)
        with contextlib.suppress(FileNotFound):
            await self.containers.runtime.remove_file(cid, record.path)
        self.index_store.delete([file_id])
        known = self._known.get(cid)
        if known is not None:
            known.pop(record.path, None)
        self._changed_at.get(cid, {}).pop(record.path, None)
        self.containers.touch(cid)


def _capped(chunks: Iterator[bytes], cap: int) -> Iterator[bytes]:
    total = 0
    for data in chunks:
        total += len(data)
        _check_size(total, cap)
        yield data


def _safe_basename(filename: str) -> str:
    """The name a Files API upload keeps: its last path component, usable later as a file name
    in /mnt/data (``file_ids``); "upload" when nothing usable is left."""
    name = os.path.basename(filename.replace("\x00", ""))
    return name if name not in ("", ".", "..") else "upload"
