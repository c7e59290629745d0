"""Uploaded bytes kept by the server (Files API files, skill bundles), under a key.

``FsBlobStore`` keeps them as files in a directory of this machine: one ``shellbox serve``.
``SqlBlobStore`` keeps them in the database, cut in chunks, so that every API replica reaches
what any of them stored; neither a write nor a read holds more than one chunk in memory.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from sqlalchemy import delete, func, insert, select

from shellbox.store.db import Database
from shellbox.store.tables import blob_chunks

CHUNK_BYTES = 1 << 20
READ_BYTES = 1 << 16
_KEY = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*")


def check_key(key: str) -> str:
    # Keys are ours (file ids, skill ids), but one becomes a path: never taken on trust.
    if len(key) > 255 or not _KEY.fullmatch(key):
        msg = f"not a valid blob key: {key!r}"
        raise ValueError(msg)
    return key


@dataclass(frozen=True)
class Blob:
    size: int  # bytes
    chunks: Iterator[bytes]  # read as iterated


class BlobStore(Protocol):
    def put(self, key: str, src: Path) -> int:
        """Keep the bytes of ``src`` (a file of this process's, consumed: moved or copied;
        the caller removes it if it is still there) under ``key``, replacing what was there;
        returns their size."""
        ...

    def open(self, key: str) -> Blob | None:
        """The bytes under ``key``, opened now (None: nothing there)."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Forget the keys (missing ones are fine)."""


class FsBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put(self, key: str, src: Path) -> int:
        dest = self.path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        size = src.stat().st_size
        try:
            os.replace(src, dest)
        except OSError:  # another filesystem: a copy, then the caller's file stays
            shutil.copyfile(src, dest)
        return size

    def open(self, key: str) -> Blob | None:
        try:
            f = open(self.path(key), "rb")  # noqa: SIM115 - closed by _read
        except FileNotFoundError:
            return None
        return Blob(os.fstat(f.fileno()).st_size, _read(f))

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.path(key).unlink(missing_ok=True)


def _read(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while data := f.read(READ_BYTES):
            yield data


class SqlBlobStore:
    def __init__(self, db: Database, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.db = db
        self.chunk_bytes = chunk_bytes

    def put(self, key: str, src: Path) -> int:
        """One transaction: a reader sees the old bytes or all of the new ones. Always at
        least one chunk (an empty file is one empty chunk), so that a key exists iff its
        chunk 0 does."""
        check_key(key)
        size = 0
        with self.db.begin() as conn, open(src, "rb") as f:
            conn.execute(delete(blob_chunks).where(blob_chunks.c.key == key))
            n = 0
            while True:
                data = f.read(self.chunk_bytes)
                if not data and n:
                    break
                conn.execute(insert(blob_chunks).values(key=key, n=n, data=data))
                size += len(data)
                n += 1
                if len(data) < self.chunk_bytes:
                    break
        return size

    def open(self, key: str) -> Blob | None:
        check_key(key)
        with self.db.connect() as conn:
            count, size = conn.execute(
                select(func.count(), func.coalesce(func.sum(func.length(blob_chunks.c.data)), 0))
                .select_from(blob_chunks)
                .where(blob_chunks.c.key == key)
            ).one()
        if not count:
            return None
        return Blob(int(size), self._chunks(key, int(count)))

    def _chunks(self, key: str, count: int) -> Iterator[bytes]:
        # A chunk per query: no connection is held while the client reads at its own pace.
        # Bytes deleted meanwhile (the file expired or was deleted mid-download) end the
        # download with an error rather than short.
        for n in range(count):
            with self.db.connect() as conn:
                data = conn.execute(
                    select(blob_chunks.c.data).where(blob_chunks.c.key == key, blob_chunks.c.n == n)
                ).scalar()
            if data is None:
                msg = f"the bytes of {key} were deleted while they were being read"
                raise OSError(msg)
            yield bytes(data)

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            with self.db.begin() as conn:
                conn.execute(delete(blob_chunks).where(blob_chunks.c.key.in_(list(keys))))
