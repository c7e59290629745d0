"""The egress audit: the proxy appends JSON lines, the server moves them into the database.

The addon writes one line per attempt to ``audit.jsonl``; ``AuditTail.ingest`` reads what is
new since the last call (its position is kept in ``audit.offset``, so a restart of the server
neither loses nor repeats lines) and inserts it into ``egress_events``. When the file has grown
past ``ROTATE_BYTES`` and is fully read, it is renamed to ``audit.jsonl.1``; the addon notices
within a second and starts a fresh file, and the server drains the old one until it has been
quiet for a few seconds, then removes it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shellbox.egress.paths import write_atomic
from shellbox.ids import new_id
from shellbox.store import EgressStore

log = logging.getLogger("shellbox.egress")

ROTATE_BYTES = 32 << 20
ROTATED_QUIET_S = 3.0
MAX_BATCH_BYTES = 4 << 20


@dataclass
class _Position:
    inode: int
    offset: int


class AuditTail:
    def __init__(
        self,
        store: EgressStore,
        path: Path,
        offset_path: Path,
        *,
        rotate_bytes: int = ROTATE_BYTES,
        quiet_s: float = ROTATED_QUIET_S,
    ) -> None:
        self.store = store
        self.path = path
        self.offset_path = offset_path
        self.rotate_bytes = rotate_bytes
        self.quiet_s = quiet_s
        self.rotated = path.with_name(path.name + ".1")
        self.pos = self._load()

    def _load(self) -> _Position:
        try:
            inode, offset = self.offset_path.read_text().split()
            return _Position(int(inode), int(offset))
        except (OSError, ValueError):
            return _Position(0, 0)

    def _save(self) -> None:
        write_atomic(self.offset_path, f"{self.pos.inode} {self.pos.offset}".encode(), 0o600)

    def ingest(self) -> int:
        """Move every complete new line into the database; returns how many."""
        total = 0
        while True:
            source = self._source()
            n = self._ingest_batch(source)
            total += n
            if n == 0 and self._source() == source:
                return total

    def _source(self) -> Path:
        """The rotated file while it still has lines for us, else the live one."""
        try:
            if os.stat(self.rotated).st_ino == self.pos.inode:
                return self.rotated
        except FileNotFoundError:
            pass
        return self.path

    def _ingest_batch(self, source: Path) -> int:
        try:
            f = open(source, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return 0
        with f:
            st = os.fstat(f.fileno())
            if st.st_ino != self.pos.inode:
                self.pos = _Position(st.st_ino, 0)
            if st.st_size < self.pos.offset:  # truncated by someone: start over
                self.pos.offset = 0
            f.seek(self.pos.offset)
            chunk = f.read(MAX_BATCH_BYTES)
        end = chunk.rfind(b"\n")
        if end < 0:
            self._after_eof(source, st.st_size, st.st_mtime)
            return 0
        lines = chunk[: end + 1].splitlines()
        rows = [r for r in (_row(line) for line in lines) if r is not None]
        self.store.add_events(rows)
        self.pos.offset += end + 1
        self._save()
        return len(lines)

    def _after_eof(self, source: Path, size: int, mtime: float) -> None:
        if source == self.rotated:
            # The proxy notices a rotation within a second; after that nobody writes here.
            if time.time() - mtime > self.quiet_s:
                self.rotated.unlink(missing_ok=True)
        elif size >= self.rotate_bytes and self.pos.offset >= size and not self.rotated.exists():
            os.replace(self.path, self.rotated)  # keep reading it (same inode) until quiet


def _row(line: bytes) -> dict[str, Any] | None:
    try:
        raw = json.loads(line)
        t = float(raw["time"])
        return {
            "id": new_id("egr_"),
            "container_id": str(raw["container"]),
            "created_at": int(t),
            "created_at_ms": int(t * 1000),
            "method": str(raw.get("method", ""))[:16],
            "scheme": str(raw.get("scheme", ""))[:8],
            "host": str(raw.get("host", ""))[:512],
            "port": int(raw.get("port") or 0),
            "path": str(raw.get("path", "")),
            "decision": "refused" if raw.get("decision") == "refused" else "allowed",
            "reason": None if raw.get("reason") is None else str(raw["reason"])[:1000],
            "status": None if raw.get("status") is None else int(raw["status"]),
            "request_bytes": int(raw.get("request_bytes") or 0),
            "response_bytes": int(raw.get("response_bytes") or 0),
        }
    except (ValueError, KeyError, TypeError):
        log.warning("skipping a malformed egress audit line")
        return None


def event_object(row: Any) -> dict[str, Any]:
    """The wire shape of one ``container.egress_event``."""
    return {
        "id": row["id"],
        "object": "container.egress_event",
        "container_id": row["container_id"],
        "created_at": row["created_at"],
        "created_at_ms": row["created_at_ms"],
        "method": row["method"],
        "scheme": row["scheme"],
        "host": row["host"],
        "port": row["port"],
        "path": row["path"],
        "decision": row["decision"],
        "reason": row["reason"],
        "status_code": row["status"],
        "request_bytes": row["request_bytes"],
        "response_bytes": row["response_bytes"],
    }
