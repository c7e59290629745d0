"""ContainerStore contract, on SQLite and PostgreSQL."""

from __future__ import annotations

from shellbox.store import Quota, Stores
from shellbox.store.records import ContainerRecord

GIB = 1 << 30
SIZES = {"1g": GIB, "4g": 4 * GIB, "16g": 16 * GIB, "64g": 64 * GIB}
ROOMY = Quota(max_containers=100, max_memory_bytes=1000 * GIB, memory_bytes=SIZES)


def record(cid: str, project: str = "p", **kw: object) -> ContainerRecord:
    values: dict[str, object] = {
        "id": cid,
        "project": project,
        "name": "n",
        "status": "running",
        "created_at": 100,
        "last_active_at": 100,
        "expires_after_minutes": 20,
        "memory_limit": "1g",
        "network_policy": {"type": "disabled"},
    }
    values.update(kw)
    return ContainerRecord(**values)  # type: ignore[arg-type]


def test_insert_get_and_tenancy(stores: Stores) -> None:
    c = stores.containers
    skills = [{"type": "skill_reference", "skill_id": "skill_1", "version": 2}]
    policy = {"type": "allowlist", "allowed_domains": ["example.com"]}
    assert c.insert_within(record("c1", network_policy=policy, skills=skills), ROOMY) is None
    got = c.get("p", "c1")
    assert got is not None
    assert (got.network_policy, got.skills, got.secrets) == (policy, skills, [])
    assert c.get("other", "c1") is None  # another project's container does not exist
    assert c.get("p", "nope") is None
    c.set_status("c1", "deleted", deleted=True)
    assert c.get("p", "c1") is None  # hidden once deleted
    assert [r.id for r in c.all()] == ["c1"] and c.live() == []


def test_page_by_creation_order_and_name(stores: Stores) -> None:
    c = stores.containers
    for i in range(5):
        c.insert_within(record(f"c{i}", name="even" if i % 2 == 0 else "odd"), ROOMY)
    c.insert_within(record("x", project="q"), ROOMY)
    rows, more = c.page("p", name=None, after=None, limit=2, order="asc")
    assert [r.id for r in rows] == ["c0", "c1"] and more
    rows, more = c.page("p", name=None, after="c1", limit=10, order="asc")
    assert [r.id for r in rows] == ["c2", "c3", "c4"] and not more
    rows, _ = c.page("p", name="even", after=None, limit=10, order="desc")
    assert [r.id for r in rows] == ["c4", "c2", "c0"]


def test_quota_counts_live_rows_and_refuses_past_the_caps(stores: Stores) -> None:
    c = stores.containers
    quota = Quota(max_containers=2, max_memory_bytes=5 * GIB, memory_bytes=SIZES)
    assert c.insert_within(record("a", memory_limit="4g"), quota) is None
    refused = c.insert_within(record("b", memory_limit="4g"), quota)  # 8 GiB > 5
    assert refused is not None and refused.counts == {"4g": 1}
    assert c.insert_within(record("b", memory_limit="1g"), quota) is None
    refused = c.insert_within(record("c"), quota)  # 2 containers already
    assert refused is not None and refused.containers == 2
    assert c.get("p", "c") is None
    c.set_status("a", "expired")  # ended containers do not count
    assert c.usage("p").counts == {"1g": 1}
    assert c.insert_within(record("c"), quota) is None
    assert c.insert_within(record("d", project="q"), quota) is None  # per project


def test_activity_never_goes_back(stores: Stores) -> None:
    c = stores.containers
    c.insert_within(record("a"), ROOMY)
    c.insert_within(record("b"), ROOMY)
    c.touch([("a", 500), ("b", 300)])
    c.touch([("a", 400)])  # another server's older news
    got = {r.id: r.last_active_at for r in c.live()}
    assert got == {"a": 500, "b": 300}


def test_status_secrets_skills_and_lookups(stores: Stores) -> None:
    c = stores.containers
    c.insert_within(record("a", secrets=[{"sealed": "x"}]), ROOMY)
    c.insert_within(record("b", skills=[{"skill_id": "s"}]), ROOMY)
    c.insert_within(record("gone"), ROOMY)
    c.remove("gone")
    assert sorted(c.ids()) == ["a", "b"]
    c.set_status("a", "sleeping")
    assert {r.id: r.status for r in c.live()} == {"a": "sleeping", "b": "running"}
    assert [r.id for r in c.by_ids(["b", "zzz"])] == ["b"] and c.by_ids([]) == []
    assert c.live_skills() == [("b", [{"skill_id": "s"}])]
    assert c.with_secrets() == [("a", [{"sealed": "x"}])]
    c.set_secrets("a", [{"sealed": "y"}])
    c.scrub()
    assert c.with_secrets() == [("a", [{"sealed": "y"}])]
