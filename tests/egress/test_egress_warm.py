"""Creating an allowlist container takes one started ahead of time in an egress namespace of
its own (``egress.warm_containers``); the proxy learns its policy only then."""

from __future__ import annotations

import contextlib
import json

from egress_helpers import (
    EgressServer,
    Upstream,
    create,
    egress_run_dir,
    owned_namespaces,
    run,
    wait_for,
)

SECRET = "warm-s3cret-value"
POLICY = {
    "type": "allowlist",
    "allowed_domains": ["api.example.test"],
    "domain_secrets": [{"domain": "api.example.test", "name": "TOKEN", "value": SECRET}],
}


def pooled_allowlist_ids(es: EgressServer) -> set[str]:
    """Containers the runtime holds in an egress namespace that the API does not list."""
    on_disk = set()
    for spec in (es.server.state_dir / "containers").glob("*/spec.json"):
        with contextlib.suppress(ValueError):  # one being written by the pool's filler
            if json.loads(spec.read_text()).get("network"):
                on_disk.add(spec.parent.name)
    with es.http as http:
        listed = {c["id"] for c in http.get("/v1/containers", params={"limit": 100}).json()["data"]}
    return on_disk - listed


def proxy_clients(es: EgressServer) -> set[str]:
    """The containers the proxy has a policy for (its policy.json, written by the server)."""
    policy = json.loads((egress_run_dir(es) / "policy.json").read_text())
    return {c["container"] for c in policy["clients"].values()}


def test_allowlist_creation_takes_a_pooled_container(
    egress: EgressServer, upstream: Upstream
) -> None:
    with egress.http as http:
        first = create(http, POLICY)  # the proxy runs from now on; the pool fills
        wait_for(lambda: len(pooled_allowlist_ids(egress)) == 1)
        [pooled] = pooled_allowlist_ids(egress)
        assert first in proxy_clients(egress) and pooled not in proxy_clients(egress)
        # A refused creation is refused before a pooled container is taken.
        bad = {"type": "allowlist", "allowed_domains": ["https://bad.example.test/"]}
        r = http.post("/v1/containers", json={"name": "bad", "network_policy": bad})
        assert r.status_code == 400, r.text
        assert pooled_allowlist_ids(egress) == {pooled}
        second = create(http, POLICY)
        assert second == pooled
        upstream.clear()
        token, allowed, refused = run(
            http,
            second,
            'printf %s "$TOKEN"',
            'curl -sS -m 20 -H "Authorization: Bearer $TOKEN" https://api.example.test/echo',
            "curl -sS -m 20 -o /dev/null -w '%{http_code}' https://other.example.test/",
        )
        assert token["stdout"].startswith("shellbox-secret-"), token
        assert json.loads(allowed["stdout"])["tls"] is True, allowed
        assert refused["stdout"] == "000" and "403" in refused["stderr"], refused
        assert [s["headers"]["authorization"] for s in upstream.seen()] == [f"Bearer {SECRET}"]

        assert second in proxy_clients(egress)
        # Deleting gives the namespaces back: the warm ones and the refilled pool's remain.
        wait_for(lambda: len(pooled_allowlist_ids(egress)) == 1)
        before = len(owned_namespaces(egress.server))
        for cid in (first, second):
            http.delete(f"/v1/containers/{cid}")
        wait_for(lambda: len(owned_namespaces(egress.server)) == before - 2)
        assert proxy_clients(egress).isdisjoint({first, second})
