"""UsageStore and StatsStore contracts (metering, issue 14), on SQLite and PostgreSQL: a usage
row written alone or with its stored response in one transaction, bucket totals computed by
the database, and the figures /metrics reads."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from shellbox.store import Quota, Stores
from shellbox.store.metering import SandboxUsage, UsageQuery
from shellbox.store.records import ContainerRecord

DAY_MS = 86_400_000
ORIGIN_MS = 1_790_000_000_000  # a Unix time in milliseconds: beyond 32-bit integers


def usage(
    uid: str,
    *,
    project: str = "p",
    key: str | None = "key_1",
    container: str = "cntr_1",
    ended_at_ms: int = ORIGIN_MS,
    billed_ms: int = 1500,
) -> SandboxUsage:
    return SandboxUsage(
        id=uid,
        project=project,
        api_key_id=key,
        container_id=container,
        kind="call",
        started_at_ms=ended_at_ms - 1000,
        ended_at_ms=ended_at_ms,
        measured_ms=1000,
        billed_ms=billed_ms,
        started_container=billed_ms > 1000,
    )


def test_a_request_is_billed_once(stores: Stores) -> None:
    u = stores.usage
    first = usage("call_1")
    assert u.record(first)
    assert not u.record(usage("call_1", billed_ms=99_000))  # the same request: not again
    assert u.get("call_1") == first
    assert u.get("call_2") is None


def test_totals_in_buckets_by_project_and_key(stores: Stores) -> None:
    u = stores.usage
    rows = [
        usage("a", ended_at_ms=ORIGIN_MS, billed_ms=30_000),
        usage("b", ended_at_ms=ORIGIN_MS + DAY_MS - 1, container="cntr_2", billed_ms=500),
        usage("c", ended_at_ms=ORIGIN_MS + DAY_MS - 1, project="q", key="key_2", billed_ms=7),
        usage("d", ended_at_ms=ORIGIN_MS + 2 * DAY_MS + 5, billed_ms=1234),
        usage("e", ended_at_ms=ORIGIN_MS + 3 * DAY_MS, billed_ms=1),  # past the end
        usage("f", ended_at_ms=ORIGIN_MS - 1, billed_ms=1),  # before the start
    ]
    for row in rows:
        u.record(row)
    q = UsageQuery(ORIGIN_MS, ORIGIN_MS + 3 * DAY_MS, ORIGIN_MS, DAY_MS)
    got = [(t.bucket, t.project, t.sessions, t.billed_ms, t.requests) for t in u.totals(q)]
    # Integer bucket indexes (not rounded: 86_399_999 ms is still day 0), whole sums.
    assert got == [(0, None, 2, 30_507, 3), (2, None, 1, 1234, 1)]

    by_project = UsageQuery(ORIGIN_MS, ORIGIN_MS + 3 * DAY_MS, ORIGIN_MS, DAY_MS, by_project=True)
    got = [(t.bucket, t.project, t.billed_ms) for t in u.totals(by_project)]
    assert got == [(0, "p", 30_500), (0, "q", 7), (2, "p", 1234)]

    only_q = UsageQuery(ORIGIN_MS, ORIGIN_MS + 3 * DAY_MS, ORIGIN_MS, DAY_MS, project_ids=["q"])
    assert [(t.bucket, t.billed_ms) for t in u.totals(only_q)] == [(0, 7)]
    key_1 = UsageQuery(ORIGIN_MS, ORIGIN_MS + DAY_MS, ORIGIN_MS, DAY_MS, api_key_ids=["key_1"])
    assert [(t.sessions, t.billed_ms, t.requests) for t in u.totals(key_1)] == [(2, 30_500, 2)]
    assert u.totals(UsageQuery(0, 1, 0, DAY_MS)) == []


def test_a_stored_response_and_its_usage_commit_together(stores: Stores) -> None:
    body = {"id": "resp_1", "created_at": 5, "status": "completed", "output": []}
    stores.responses.save("p", body, [], "cntr_1", usage=usage("resp_1"))
    assert stores.responses.get("p", "resp_1") is not None
    assert stores.usage.get("resp_1") == usage("resp_1")
    # The response cannot be written (its id is taken): its usage is not written either.
    with pytest.raises(IntegrityError):
        stores.responses.save("p", body, [], "cntr_1", usage=usage("resp_1_again"))
    assert stores.usage.get("resp_1_again") is None
    stores.responses.save("p", {**body, "id": "resp_2"}, [], None)  # no usage: the response only
    assert stores.usage.get("resp_2") is None


def test_the_figures_metrics_reads(stores: Stores) -> None:
    s = stores.stats
    assert s.containers_by_status() == {} and s.billed_ms_by_project() == {}
    assert s.egress_decisions() == {}
    quota = Quota(100, 1 << 40, {"1g": 1 << 30})
    for cid, status in (("a", "running"), ("b", "running"), ("c", "sleeping")):
        record = ContainerRecord(cid, "p", "n", "running", 0, 0, 20, "1g", {"type": "disabled"})
        stores.containers.insert_within(record, quota)
        stores.containers.set_status(cid, status)  # type: ignore[arg-type]
    stores.usage.record(usage("x", billed_ms=30_000))
    stores.usage.record(usage("y", billed_ms=5))
    stores.usage.record(usage("z", project="q", billed_ms=7))
    assert s.containers_by_status() == {"running": 2, "sleeping": 1}
    assert s.billed_ms_by_project() == {"p": 30_005, "q": 7}
