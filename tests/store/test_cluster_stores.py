"""NodeStore, LeaseStore and the blob stores (issue 15), on SQLite and PostgreSQL: node
registration and loss, placement by free memory then fewest containers, a lease one process
holds at a time, and chunked bytes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_store_concurrency import at_once

from shellbox.store import Database, Stores
from shellbox.store.blobs import BlobStore, FsBlobStore, SqlBlobStore
from shellbox.store.nodes import Refused

GIB = 1 << 30
INFO = {"image_id": "minimal-1", "image_profile": "minimal"}


def test_a_node_registers_beats_and_stops(stores: Stores) -> None:
    n = stores.nodes
    assert not n.heartbeat("a", 3)  # not registered: it must register first
    n.register("a", "http://10.0.0.1:9000", 8 * GIB, INFO)
    node = n.get("a")
    assert node is not None
    assert (node.url, node.state, node.memory_bytes, node.info) == (
        "http://10.0.0.1:9000",
        "up",
        8 * GIB,
        INFO,
    )
    assert node.available(timeout_ms=60_000)
    time.sleep(0.6)
    assert not n.get("a").available(timeout_ms=500)  # type: ignore[union-attr]
    assert n.heartbeat("a", 3)
    beat = n.get("a")
    assert beat is not None and beat.containers == 3 and beat.available(timeout_ms=500)
    n.deregister("a")
    assert n.get("a").state == "stopped"  # type: ignore[union-attr]
    assert not n.get("a").available(timeout_ms=60_000)  # type: ignore[union-attr]
    assert not n.heartbeat("a", 3)  # a stopped node registers again to come back
    n.register("a", "http://10.0.0.2:9000", 4 * GIB, INFO)
    back = n.get("a")
    assert back is not None and back.state == "up" and back.url == "http://10.0.0.2:9000"
    assert [x.name for x in n.all()] == ["a"]


def test_placement_needs_free_memory_then_takes_the_fewest_containers(stores: Stores) -> None:
    n = stores.nodes
    n.register("a", "http://a", 4 * GIB, INFO)
    n.register("b", "http://b", 8 * GIB, INFO)
    wait = 60_000
    assert n.place("c1", "container", GIB, timeout_ms=wait).name == "a"  # type: ignore[union-attr]
    assert n.place("c2", "container", GIB, timeout_ms=wait).name == "b"  # type: ignore[union-attr]
    assert n.place("c3", "container", GIB, timeout_ms=wait).name == "a"  # type: ignore[union-attr]
    # a has 2 GiB free, b 7: a 4 GiB container only fits on b
    assert n.place("c4", "container", 4 * GIB, timeout_ms=wait).name == "b"  # type: ignore[union-attr]
    refused = n.place("c5", "container", 16 * GIB, timeout_ms=wait)
    assert isinstance(refused, Refused)
    assert {(x.node.name, x.placed, x.free_memory_bytes) for x in refused.loads} == {
        ("a", 2, 2 * GIB),
        ("b", 2, 3 * GIB),
    }
    # snapshots take no memory and do not count as containers; ``on`` pins the node
    assert n.place("snap1", "snapshot", 0, timeout_ms=wait, on="a").name == "a"  # type: ignore[union-attr]
    assert n.place("c6", "container", GIB, timeout_ms=wait, on="a").name == "a"  # type: ignore[union-attr]
    assert n.placed("a", "container") == ["c1", "c3", "c6"]
    assert n.placed("a", "snapshot") == ["snap1"]
    assert n.node_of("c4").name == "b"  # type: ignore[union-attr]
    assert n.node_of("nope") is None
    n.unplace("c4")
    assert n.node_of("c4") is None
    assert n.place("c7", "container", 4 * GIB, timeout_ms=wait).name == "b"  # type: ignore[union-attr]


def test_a_lost_or_stopped_node_gets_nothing(stores: Stores) -> None:
    n = stores.nodes
    n.register("a", "http://a", 64 * GIB, INFO)
    n.register("b", "http://b", 64 * GIB, INFO)
    time.sleep(1.2)
    n.heartbeat("b", 0)
    for i in range(3):  # a is silent past the timeout: lost
        assert n.place(f"c{i}", "container", GIB, timeout_ms=1000).name == "b"  # type: ignore[union-attr]
    assert n.node_of("c0").name == "b"  # type: ignore[union-attr]
    n.deregister("b")
    refused = n.place("c9", "container", GIB, timeout_ms=1000)
    assert refused == Refused([])  # no node available at all
    assert isinstance(n.place("c9", "container", GIB, timeout_ms=1000, on="a"), Refused)


def test_a_doomed_placement_keeps_its_memory_until_it_is_removed(stores: Stores) -> None:
    """Deleted while its node was away: listed as doomed for that node (for the replicas to
    remove once it is back), no longer as placed, and its memory still taken there."""
    n = stores.nodes
    n.register("a", "http://a", 2 * GIB, INFO)
    wait = 60_000
    assert n.place("c1", "container", 2 * GIB, timeout_ms=wait).name == "a"  # type: ignore[union-attr]
    assert n.place("s1", "snapshot", 0, timeout_ms=wait).name == "a"  # type: ignore[union-attr]
    n.doom("c1")
    n.doom("s1")
    n.doom("never-placed")  # nothing to mark
    assert n.doomed("a") == [("c1", "container"), ("s1", "snapshot")]
    assert n.placed("a", "container") == [] and n.placed("a", "snapshot") == []
    assert n.node_of("c1").name == "a"  # type: ignore[union-attr]
    assert isinstance(n.place("c2", "container", GIB, timeout_ms=wait), Refused)
    n.unplace("c1")
    assert n.doomed("a") == [("s1", "snapshot")]
    assert n.place("c2", "container", GIB, timeout_ms=wait).name == "a"  # type: ignore[union-attr]


def test_replicas_placing_at_once_never_overfill_a_node(stores: Stores) -> None:
    stores.nodes.register("a", "http://a", 3 * GIB, INFO)
    results = at_once(8, lambda i: stores.nodes.place(f"c{i}", "container", GIB, timeout_ms=60_000))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(not isinstance(r, Refused) for r in results) == 3
    assert len(stores.nodes.placed("a", "container")) == 3


def test_a_lease_has_one_holder_until_it_lapses(stores: Stores) -> None:
    leases = stores.leases
    assert leases.acquire("reaper", "r1", ttl_ms=1000)
    assert leases.acquire("reaper", "r1", ttl_ms=1000)  # renewed
    assert not leases.acquire("reaper", "r2", ttl_ms=1000)
    assert leases.holder("reaper") == "r1"
    assert leases.acquire("other", "r2", ttl_ms=1000)  # leases are independent
    time.sleep(1.1)  # r1 died: its lease lapses and r2 takes over
    assert leases.holder("reaper") is None
    assert leases.acquire("reaper", "r2", ttl_ms=60_000)
    assert not leases.acquire("reaper", "r1", ttl_ms=60_000)
    leases.release("reaper", "r1")  # not r1's: nothing happens
    assert leases.holder("reaper") == "r2"
    leases.release("reaper", "r2")
    assert leases.acquire("reaper", "r1", ttl_ms=60_000)


def test_processes_taking_a_lease_at_once_get_one_holder(stores: Stores) -> None:
    results = at_once(8, lambda i: stores.leases.acquire("reaper", f"r{i}", ttl_ms=60_000))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r is True for r in results) == 1
    winner = stores.leases.holder("reaper")
    assert winner is not None and results[int(winner[1:])] is True


@pytest.fixture(params=["fs", "sql"])
def blobs(request: pytest.FixtureRequest, db: Database, tmp_path: Path) -> BlobStore:
    if request.param == "fs":
        return FsBlobStore(tmp_path / "blobs")
    return SqlBlobStore(db, chunk_bytes=1000)


def test_blobs_keep_bytes_in_chunks(blobs: BlobStore, tmp_path: Path) -> None:
    cases = {"empty": b"", "small": b"hello", "exact": b"x" * 2000, "big": bytes(range(256)) * 37}
    for key, data in cases.items():
        src = tmp_path / f"src-{key}"
        src.write_bytes(data)
        assert blobs.put(f"files/{key}", src) == len(data)
    for key, data in cases.items():
        blob = blobs.open(f"files/{key}")
        assert blob is not None and blob.size == len(data)
        assert b"".join(blob.chunks) == data
    replaced = tmp_path / "src-new"
    replaced.write_bytes(b"new")
    blobs.put("files/big", replaced)
    new = blobs.open("files/big")
    assert new is not None and b"".join(new.chunks) == b"new"
    assert blobs.open("files/none") is None
    blobs.delete(["files/small", "files/none"])
    assert blobs.open("files/small") is None
    assert blobs.open("files/empty") is not None
    with pytest.raises(ValueError, match="not a valid blob key"):
        blobs.open("../etc/passwd")


def test_sql_blob_reads_hold_one_chunk(db: Database, tmp_path: Path) -> None:
    store = SqlBlobStore(db, chunk_bytes=1 << 16)
    src = tmp_path / "src"
    src.write_bytes(b"a" * (1 << 16) * 5 + b"b")
    store.put("k", src)
    blob = store.open("k")
    assert blob is not None and blob.size == (1 << 16) * 5 + 1
    sizes = [len(c) for c in blob.chunks]
    assert sizes == [1 << 16] * 5 + [1]


def test_two_replicas_putting_one_container_to_sleep_do_it_once(stores: Stores) -> None:
    from shellbox.store import Quota
    from shellbox.store.records import ContainerRecord

    quota = Quota(max_containers=10, max_memory_bytes=100 * GIB, memory_bytes={"1g": GIB})
    record = ContainerRecord("c1", "p", "n", "running", 0, 100, 20, "1g", {"type": "disabled"})
    assert stores.containers.insert_within(record, quota) is None
    c = stores.containers
    # activity after what the reaper saw: it stays as it is
    assert not c.transition("c1", "sleeping", expected=("running",), idle_since=99)
    results = at_once(
        8, lambda _: c.transition("c1", "sleeping", expected=("running",), idle_since=100)
    )
    assert [r for r in results if r is not False] == [True], results
    assert c.get("p", "c1").status == "sleeping"  # type: ignore[union-attr]
    results = at_once(
        8,
        lambda _: c.transition(
            "c1", "expired", expected=("running", "sleeping", "paused"), idle_since=100
        ),
    )
    assert [r for r in results if r is not False] == [True], results
    assert c.get("p", "c1").status == "expired"  # type: ignore[union-attr]
