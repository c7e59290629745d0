"""``Database.first_row`` and ``Database.write``, the compiled-once paths every request takes,
convert values as SQLAlchemy's own execution does, on SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import bindparam, delete, select, update

from shellbox.store import Database
from shellbox.store.db import insert_new
from shellbox.store.tables import sandbox_usage

ROW = {
    "id": "call_1",
    "project": "p",
    "api_key_id": None,
    "container_id": "cntr_1",
    "kind": "call",
    "started_at_ms": 1,
    "ended_at_ms": 2,
    "measured_ms": 1,
    "billed_ms": 1000,
    "started_container": True,
}

t = sandbox_usage.c
READ = select(t.id, t.billed_ms, t.started_container).where(
    t.id == bindparam("b_id"),
    t.kind == "call",  # a value written in the statement
)
BILL = update(sandbox_usage).where(t.id == bindparam("b_id")).values(billed_ms=bindparam("ms"))
DROP = delete(sandbox_usage).where(t.id == bindparam("b_id"))


def test_insert_new_writes_a_row_once_and_reads_come_back_typed(db: Database) -> None:
    insert = insert_new(db.engine.dialect, sandbox_usage, t.id)
    assert db.write(insert, ROW) == 1
    assert db.write(insert, ROW | {"billed_ms": 5}) == 0  # its key exists: skipped
    row = db.first_row(READ, {"b_id": "call_1"})
    assert row == {"id": "call_1", "billed_ms": 1000, "started_container": True}
    assert row is not None and row["started_container"] is True  # a bool, not 1
    assert db.first_row(READ, {"b_id": "call_2"}) is None


def test_writes_report_the_rows_they_changed_and_are_committed(db: Database) -> None:
    db.write(insert_new(db.engine.dialect, sandbox_usage, t.id), ROW)
    assert db.write(BILL, {"b_id": "call_1", "ms": 7}) == 1
    assert db.write(BILL, {"b_id": "nope", "ms": 7}) == 0
    with db.connect() as conn:  # another connection sees it: committed
        assert conn.execute(select(t.billed_ms)).scalar_one() == 7
    assert db.write(DROP, {"b_id": "call_1"}) == 1
    assert db.first_row(READ, {"b_id": "call_1"}) is None
