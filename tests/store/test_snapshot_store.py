"""SnapshotStore contract, on SQLite and PostgreSQL: the per-project count and bytes, hidden
(deleted) snapshots whose bytes count while live forks name them, and expiry by last use."""

from __future__ import annotations

from test_container_store import ROOMY, record

from shellbox.store import SnapshotQuota, SnapshotRecord, SnapshotUsage, Stores, create_stores
from shellbox.store.db import Database

MIB = 1 << 20
QUOTA = SnapshotQuota(max_count=10, max_bytes=100 * MIB)


def snap(sid: str, project: str = "p", mib: int = 10, used: int = 100) -> SnapshotRecord:
    return SnapshotRecord(sid, project, "cntr_x", None, "ready", mib * MIB, used, used)


def test_bytes_count_against_the_quota_and_a_refusal_says_the_use(stores: Stores) -> None:
    s = stores.snapshots
    assert s.insert_within(snap("snap_a", mib=60), QUOTA) is None
    assert s.insert_within(snap("snap_b", mib=30), QUOTA) is None
    assert s.insert_within(snap("snap_other", project="q", mib=90), QUOTA) is None
    assert s.usage("p") == SnapshotUsage(count=2, bytes=90 * MIB, held_bytes=0)
    # 90 + 11 MiB would pass 100: refused, nothing inserted, the use that refused it returned
    assert s.insert_within(snap("snap_c", mib=11), QUOTA) == SnapshotUsage(2, 90 * MIB, 0)
    assert s.get("p", "snap_c") is None
    assert s.insert_within(snap("snap_c", mib=10), QUOTA) is None  # exactly at the quota
    few = SnapshotQuota(max_count=3, max_bytes=1 << 40)
    assert s.insert_within(snap("snap_d", mib=0), few) == SnapshotUsage(3, 100 * MIB, 0)


def test_a_deleted_snapshot_counts_while_a_live_fork_names_it(db: Database, stores: Stores) -> None:
    s, c = stores.snapshots, stores.containers
    assert s.insert_within(snap("snap_a", mib=40), QUOTA) is None
    assert s.insert_within(snap("snap_b", mib=20), QUOTA) is None
    assert c.insert_within(record("cntr_f1", snapshot_id="snap_a"), ROOMY) is None
    assert c.insert_within(record("cntr_f2", snapshot_id="snap_a"), ROOMY) is None
    assert c.get("p", "cntr_f1").snapshot_id == "snap_a"  # type: ignore[union-attr]
    s.hide("snap_a", 200)
    s.hide("snap_b", 200)
    # The API no longer sees either; snap_a's bytes still count (forks use its data).
    assert s.get("p", "snap_a") is None
    assert s.page("p", after=None, limit=10, order="asc") == ([], False)
    assert s.usage("p") == SnapshotUsage(count=0, bytes=40 * MIB, held_bytes=40 * MIB)
    assert s.released() == ["snap_b"]
    assert s.ids() == []  # no listed snapshot keeps storage
    # A server restart (a new store on the same database) sees the same.
    again = create_stores(db).snapshots
    assert again.usage("p") == SnapshotUsage(0, 40 * MIB, 40 * MIB)
    # One fork ends (deleted); the other sleeps, then expires: then nothing holds snap_a.
    c.set_status("cntr_f1", "deleted", deleted=True)
    c.set_status("cntr_f2", "sleeping")
    assert s.usage("p").held_bytes == 40 * MIB
    c.set_status("cntr_f2", "expired")
    assert s.usage("p") == SnapshotUsage(0, 0, 0)
    assert sorted(s.released()) == ["snap_a", "snap_b"]
    s.remove("snap_a")
    assert s.released() == ["snap_b"]


def test_snapshots_unused_since_a_time(stores: Stores) -> None:
    s = stores.snapshots
    for sid, at in (("snap_old", 100), ("snap_new", 500), ("snap_forked", 100)):
        assert s.insert_within(snap(sid, used=at), QUOTA) is None
    s.used("snap_forked", 450)  # a fork counts as use
    s.used("snap_forked", 300)  # (never moved back)
    assert [r.id for r in s.unused_since(400)] == ["snap_old"]
    assert [r.id for r in s.unused_since(501)] == ["snap_old", "snap_new", "snap_forked"]
    s.hide("snap_old", 600)
    assert [r.id for r in s.unused_since(400)] == []  # hidden ones are gone already
