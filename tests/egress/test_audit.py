"""The audit tail: lines the proxy appends become rows once, across restarts and rotations."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sqlalchemy import func, select

from shellbox.egress.audit import AuditTail
from shellbox.store import create_database
from shellbox.store.egress import SqlEgressStore
from shellbox.store.tables import egress_events


def line(n: int, **kw: object) -> bytes:
    record = {
        "time": time.time(), "container": "cntr_a", "method": "GET", "scheme": "https",
        "host": "h.io", "port": 443, "path": f"/{n}", "decision": "allowed", "reason": None,
        "status": 200, "request_bytes": 0, "response_bytes": n, **kw,
    }  # fmt: skip
    return json.dumps(record).encode() + b"\n"


def paths(db: object) -> list[str]:
    with db.connect() as conn:  # type: ignore[attr-defined]
        return [r.path for r in conn.execute(select(egress_events).order_by(egress_events.c.seq))]


def test_lines_are_ingested_once_across_restarts(tmp_path: Path) -> None:
    db = create_database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    audit, offset = tmp_path / "audit.jsonl", tmp_path / "audit.offset"
    audit.write_bytes(line(1) + line(2) + line(3)[:20])  # the last one is still being written
    tail = AuditTail(SqlEgressStore(db), audit, offset)
    assert tail.ingest() == 2
    with open(audit, "ab") as f:
        f.write(line(3)[20:] + b"not json\n" + line(4, decision="refused", status=520))
    tail = AuditTail(SqlEgressStore(db), audit, offset)  # a new server: resumes at the saved offset
    assert tail.ingest() == 3
    assert paths(db) == ["/1", "/2", "/3", "/4"]  # the malformed line is skipped
    with db.connect() as conn:
        refused = conn.execute(select(egress_events).where(egress_events.c.path == "/4")).one()
    assert refused.decision == "refused" and refused.status == 520
    assert tail.ingest() == 0


def test_rotation_drains_the_old_file(tmp_path: Path) -> None:
    db = create_database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    audit, offset = tmp_path / "audit.jsonl", tmp_path / "audit.offset"
    tail = AuditTail(SqlEgressStore(db), audit, offset, rotate_bytes=100, quiet_s=0.2)
    audit.write_bytes(line(1) + line(2))
    assert tail.ingest() == 2  # ...and, fully read and past 100 bytes, it is rotated away
    rotated = tmp_path / "audit.jsonl.1"
    assert rotated.exists() and not audit.exists()
    with open(rotated, "ab") as f:  # a writer that has not noticed yet
        f.write(line(3))
    fresh = line(4)
    audit.write_bytes(fresh)  # the writer's fresh file
    assert tail.ingest() == 1  # the old file first, until it has been quiet
    assert paths(db) == ["/1", "/2", "/3"]
    past = time.time() - 1
    os.utime(rotated, (past, past))
    assert tail.ingest() == 1
    assert paths(db) == ["/1", "/2", "/3", "/4"]
    # the old file is gone; (the fresh one, past 100 bytes too, has been rotated in its turn)
    assert rotated.read_bytes() == fresh
    with db.connect() as conn:
        assert conn.execute(select(func.count()).select_from(egress_events)).scalar() == 4
