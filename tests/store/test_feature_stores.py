"""SkillStore, ResponseStore, EgressStore and IdempotencyStore contracts, on SQLite and
PostgreSQL."""

from __future__ import annotations

import pytest

from shellbox.errors import InvalidRequest, SkillNotFound
from shellbox.store import Quota, Stores
from shellbox.store.records import ContainerRecord, SkillRecord
from shellbox.store.skills import NewVersion


def version(vid: str, name: str = "s", at: int = 100) -> NewVersion:
    return NewVersion(vid, name, f"{name} does things", files=2, bytes=10, created_at=at)


def test_skills_versions_default_and_deletes(stores: Stores) -> None:
    s = stores.skills
    placed: list[object] = []
    created = s.create("p", "skill_1", version("v1", "one"), lambda: placed.append(1))
    assert created == SkillRecord("skill_1", "p", "one", "one does things", 100, 1, 1)
    with pytest.raises(SkillNotFound):
        s.get("q", "skill_1")  # another project's skill does not exist
    v2 = s.add_version(
        "p", "skill_1", version("v2", "two"), make_default=False, place=placed.append
    )
    v3 = s.add_version(
        "p", "skill_1", version("v3", "three"), make_default=True, place=placed.append
    )
    assert (v2.version, v3.version, placed) == (2, 3, [1, 2, 3])
    skill = s.get("p", "skill_1")
    assert (skill.default_version, skill.latest_version, skill.name) == (3, 3, "three")
    assert s.resolve("p", "skill_1", None, param="v").id == "v3"
    assert s.resolve("p", "skill_1", 1, param="v").id == "v1"
    with pytest.raises(SkillNotFound, match="no version '7'"):
        s.resolve("p", "skill_1", 7, param="v")
    s.set_default("p", "skill_1", 1, param="default_version")
    assert s.get("p", "skill_1").name == "one"

    def refuse_default(skill: SkillRecord, number: int) -> None:
        if number == skill.default_version:
            raise InvalidRequest("default")

    with pytest.raises(InvalidRequest):
        s.delete_version("p", "skill_1", 1, refuse_default)
    assert s.delete_version("p", "skill_1", "latest", refuse_default).id == "v3"
    assert s.get("p", "skill_1").latest_version == 2
    # numbers are never reused
    assert s.add_version("p", "skill_1", version("v4"), make_default=False, place=id).version == 4
    rows, more = s.versions("p", "skill_1", after=None, limit=10, order="asc")
    assert [v.version for v in rows] == [1, 2, 4] and not more
    assert s.existing([("skill_1", 1), ("skill_1", 3), ("x", 1)]) == {("skill_1", 1)}
    assert s.page("p", after=None, limit=10, order="asc")[0] == [s.get("p", "skill_1")]
    assert s.delete("p", "skill_1") == [1, 2, 4]
    with pytest.raises(SkillNotFound):
        s.get("p", "skill_1")


def test_a_failed_placement_leaves_no_row(stores: Stores) -> None:
    def fail(*_: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        stores.skills.create("p", "skill_1", version("v1"), fail)
    with pytest.raises(SkillNotFound):
        stores.skills.get("p", "skill_1")
    stores.skills.create("p", "skill_2", version("v2"), lambda: None)
    with pytest.raises(OSError):
        stores.skills.add_version("p", "skill_2", version("v3"), make_default=True, place=fail)
    assert stores.skills.get("p", "skill_2").latest_version == 1


def test_responses(stores: Stores) -> None:
    r = stores.responses
    body = {"id": "resp_1", "created_at": 5, "status": "completed", "output": [{"x": "é"}]}
    r.save("p", body, [{"role": "user", "content": "hi"}], "cntr_1")
    got = r.get("p", "resp_1")
    assert got is not None and (got.body, got.container_id) == (body, "cntr_1")
    assert got.conversation == [{"role": "user", "content": "hi"}]
    assert r.get("q", "resp_1") is None
    assert not r.delete("q", "resp_1")
    assert r.delete("p", "resp_1") and r.get("p", "resp_1") is None


def test_egress_slots_and_events(stores: Stores) -> None:
    e = stores.egress
    quota = Quota(100, 1 << 40, {"1g": 1 << 30})
    for cid, status in (("a", "running"), ("b", "expired")):
        stores.containers.insert_within(
            ContainerRecord(cid, "p", "n", "running", 0, 0, 20, "1g", {"type": "allowlist"}),
            quota,
        )
        stores.containers.set_status(cid, status)  # type: ignore[arg-type]
    e.claim_slot("a", 3, 100)
    e.claim_slot("b", 4, 100)
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        e.claim_slot("c", 3, 100)
    assert e.live_slots() == {"a": 3}
    assert e.slot_of("b") == 4 and e.slot_of("zz") is None
    e.release_slot("b")
    assert e.slot_of("b") is None
    row = {
        "container_id": "a",
        "created_at": 1,
        "created_at_ms": 1000,
        "method": "GET",
        "scheme": "https",
        "host": "example.com",
        "port": 443,
        "path": "/",
        "decision": "allowed",
        "reason": None,
        "status": 200,
        "request_bytes": 1,
        "response_bytes": 2,
    }
    e.add_events([{**row, "id": f"egr_{i}", "path": f"/{i}"} for i in range(3)])
    e.add_events([])
    rows, more = e.events("a", after="egr_0", limit=1, order="asc")
    assert [r["path"] for r in rows] == ["/1"] and more


def test_idempotency_claims(stores: Stores) -> None:
    i = stores.idempotency
    args = {"route": "POST /v1/containers", "fingerprint": "f"}
    assert i.claim("p", "k", **args, run="r1", at=100)
    assert not i.claim("p", "k", **args, run="r2", at=100)  # one claim per key
    assert i.claim("q", "k", **args, run="r2", at=100)  # per project
    i.attach("p", "k", "r2", "cntr_x")  # not the claimant: no effect
    i.attach("p", "k", "r1", "cntr_1")
    got = i.get("p", "k", expired_before=0)
    assert got is not None and (got.state, got.run, got.resource_id) == (
        "in_progress",
        "r1",
        "cntr_1",
    )
    assert not i.take_over("p", "k", old_run="r9", run="r3")
    assert i.take_over("p", "k", old_run="r1", run="r3")
    assert i.get("p", "k", expired_before=0).resource_id is None  # type: ignore[union-attr]
    i.finish("p", "k", "r3", status=201, content_type="application/json", body=b"{}")
    i.release("p", "k", "r3")  # a result is kept
    done = i.get("p", "k", expired_before=0)
    assert done is not None and (done.state, done.status, done.body) == ("done", 201, b"{}")
    i.release("q", "k", "r2")
    assert i.get("q", "k", expired_before=0) is None
    assert i.get("p", "k", expired_before=101) is None  # expired: deleted on sight
    i.claim("p", "old", **args, run="r1", at=50)
    i.claim("p", "new", **args, run="r1", at=150)
    i.purge(100)
    assert i.get("p", "old", expired_before=0) is None
    assert i.get("p", "new", expired_before=0) is not None
