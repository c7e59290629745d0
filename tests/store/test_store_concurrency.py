"""Concurrent writers on one database (threads with their own connections, as several
requests or several servers are): caps, idempotency claims, version numbers and the file
index hold, because each is decided by one transaction or one constraint."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import IntegrityError

from shellbox.ids import new_id
from shellbox.store import Quota, Stores
from shellbox.store.records import ContainerFileRecord, ContainerRecord
from shellbox.store.skills import NewVersion

T = TypeVar("T")
N = 12
GIB = 1 << 30


def at_once(n: int, work: Callable[[int], T]) -> list[T | BaseException]:
    """Run ``work(i)`` in ``n`` threads released together; results (or errors) by i."""
    barrier = threading.Barrier(n)
    results: list[T | BaseException] = [RuntimeError("not run")] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def container(cid: str) -> ContainerRecord:
    return ContainerRecord(cid, "p", "n", "running", 0, 0, 20, "1g", {"type": "disabled"})


def test_the_container_cap_holds_under_concurrent_creates(stores: Stores) -> None:
    quota = Quota(max_containers=3, max_memory_bytes=100 * GIB, memory_bytes={"1g": GIB})
    results = at_once(N, lambda i: stores.containers.insert_within(container(f"c{i}"), quota))
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r is None for r in results) == 3
    assert stores.containers.usage("p").containers == 3


def test_one_id_is_inserted_once(stores: Stores) -> None:
    quota = Quota(max_containers=100, max_memory_bytes=100 * GIB, memory_bytes={"1g": GIB})
    results = at_once(N, lambda _: stores.containers.insert_within(container("same"), quota))
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, IntegrityError) for r in results if r is not None), results
    assert len({new_id("cntr_") for _ in range(100_000)}) == 100_000


def test_one_idempotency_key_is_claimed_once(stores: Stores) -> None:
    def claim(i: int) -> bool:
        return stores.idempotency.claim(
            "p", "key", route="POST /v1/containers", fingerprint="f", run=f"r{i}", at=1
        )

    assert sorted(at_once(N, claim)) == [False] * (N - 1) + [True]  # type: ignore[type-var]


def test_version_numbers_are_never_shared(stores: Stores) -> None:
    stores.skills.create("p", "skill_1", NewVersion("v0", "s", "d", 1, 1, 1), lambda: None)

    def add(i: int) -> int:
        v = NewVersion(f"v{i + 1}", "s", "d", 1, 1, 1)
        return stores.skills.add_version(
            "p", "skill_1", v, make_default=False, place=lambda _: None
        ).version

    results = at_once(6, add)  # MAX_VERSION_RACES is 5: each loses at most 5 races
    numbers = [r for r in results if isinstance(r, int)]
    assert len(numbers) == len(set(numbers)) and set(numbers) <= set(range(2, 8)), results


def test_one_path_keeps_one_id_under_concurrent_indexing(stores: Stores) -> None:
    def index(i: int) -> str:
        record = ContainerFileRecord(f"cfile_{i}", "c", "a.txt", i, 1, "assistant", i)
        return stores.container_files.upsert(record, force_source=False).id

    ids = at_once(N, index)
    assert not [r for r in ids if isinstance(r, BaseException)], ids
    assert len(set(ids)) == 1
    assert [r.id for r in stores.container_files.for_container("c")] == [ids[0]]
