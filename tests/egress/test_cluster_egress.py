"""Egress through a local cluster (``shellbox.cluster.local``: two API replicas over one
PostgreSQL and two nodes, HAProxy in front): an allowlist container with a domain secret made
through one replica runs through the other; its node's proxy enforces the policy, injects the
secret and writes the audit every replica reads. Here beside the egress tests for their local
"internet"; in the cluster lane (``-m cluster``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from egress_helpers import Upstream, run, wait_for

from cluster_lane import remove_local_cluster, start_local_cluster

pytestmark = pytest.mark.cluster
SECRET = "cluster-s3cret-value"


@pytest.fixture(scope="module")
def cluster(upstream: Upstream) -> Iterator[Any]:
    c = start_local_cluster(
        "shellbox-cluster-egress-",
        env={
            "SHELLBOX_EGRESS__UPSTREAM_CA": json.dumps([str(upstream.ca)]),
            "SHELLBOX_EGRESS__HOSTS_FILE": str(upstream.hosts_file),
        },
    )
    try:
        yield c
    finally:
        remove_local_cluster(c)


def client(url: str) -> httpx.Client:
    # no API keys in this cluster's database: loopback, open
    return httpx.Client(base_url=url, headers={"authorization": "Bearer x"}, timeout=120)


def test_an_allowlist_made_through_one_replica_works_through_the_other(
    cluster: Any, upstream: Upstream
) -> None:
    policy = {
        "type": "allowlist",
        "allowed_domains": ["api.example.test"],
        "domain_secrets": [{"domain": "api.example.test", "name": "TOKEN", "value": SECRET}],
    }
    with (
        client(cluster.replica_url(1)) as a,
        client(cluster.replica_url(2)) as b,
        client(cluster.root_url) as front,
    ):
        made = []
        for via in (a, b):  # one on each node
            r = via.post("/v1/containers", json={"name": "egress", "network_policy": policy})
            assert r.status_code == 200, r.text
            made.append(r.json()["id"])
        for cid, via in zip(made, (b, a), strict=True):
            upstream.clear()
            allowed, refused = run(
                via,
                cid,
                'curl -sS -m 20 -H "Authorization: Bearer $TOKEN" https://api.example.test/echo',
                "curl -sS -m 20 -o /dev/null -w '%{http_code}' https://other.example.test/",
            )
            assert json.loads(allowed["stdout"])["tls"] is True, allowed
            assert refused["stdout"] == "000" and "403" in refused["stderr"], refused
            assert [s["headers"]["authorization"] for s in upstream.seen()] == [f"Bearer {SECRET}"]

            def audited(cid: str = cid) -> bool:
                events = front.get(f"/v1/containers/{cid}/egress", params={"limit": 100})
                hosts = {e["host"] for e in events.json()["data"]}
                return {"api.example.test", "other.example.test"} <= hosts

            wait_for(audited)
        for cid in made:
            assert front.delete(f"/v1/containers/{cid}").status_code == 200
