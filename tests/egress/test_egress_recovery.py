"""The proxy is watched and restarted; a server restart keeps allowlist containers working;
deleting a container frees its namespace."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from egress_helpers import EgressServer, Upstream, create, egress_run_dir, run, wait_for

POLICY = {
    "type": "allowlist",
    "allowed_domains": ["api.example.test"],
    "domain_secrets": [{"domain": "api.example.test", "name": "TOKEN", "value": "recovery-v4lue"}],
}
CURL = 'curl -sS -m 20 -H "Authorization: Bearer $TOKEN" https://api.example.test/echo?r={}'


def ready_file(es: EgressServer) -> Path:
    return egress_run_dir(es) / "ready"


def proxy_pid(es: EgressServer) -> int:
    return int(ready_file(es).read_text())


def netns_of(es: EgressServer, cid: str) -> str:
    with es.http as http:
        [r] = run(http, cid, "echo $HTTPS_PROXY")
    host_end = r["stdout"].strip().split("//")[1].split(":")[0]
    last = int(host_end.rsplit(".", 1)[1])
    third = int(host_end.split(".")[2])
    return f"sbe{(third * 256 + last - 1) // 4}"


def test_a_dead_proxy_is_restarted(egress: EgressServer, upstream: Upstream) -> None:
    with egress.http as http:
        cid = create(http, POLICY)
        assert "recovery-v4lue" not in run(http, cid, CURL.format(1))[0]["stdout"]
        old = proxy_pid(egress)
        os.kill(old, signal.SIGKILL)  # the proxy this test's server started
        wait_for(lambda: ready_file(egress).exists() and proxy_pid(egress) != old)
        [r] = run(http, cid, CURL.format(2))
        http.delete(f"/v1/containers/{cid}")
    assert r["outcome"]["exit_code"] == 0, r
    seen = [s for s in upstream.seen() if s["path"] == "/echo?r=2"]
    assert seen[0]["headers"]["authorization"] == "Bearer recovery-v4lue"


def test_server_restart_keeps_egress_and_release_frees_the_namespace(
    egress: EgressServer, upstream: Upstream
) -> None:
    with egress.http as http:
        cid = create(http, POLICY)
        netns = netns_of(egress, cid)
        before = http.get(f"/v1/containers/{cid}").json()
    assert Path(f"/run/netns/{netns}").exists()
    egress.server.stop()
    assert Path(f"/run/netns/{netns}").exists()  # a live container keeps its namespace
    egress.server.start()
    with egress.http as http:
        after = http.get(f"/v1/containers/{cid}").json()
        [r] = run(http, cid, CURL.format(3))
        audit = http.get(f"/v1/containers/{cid}/egress").json()["data"]
        http.delete(f"/v1/containers/{cid}")
    assert after["network_policy"] == before["network_policy"]  # fixed for its lifetime
    assert r["outcome"]["exit_code"] == 0, r
    seen = [s for s in upstream.seen() if s["path"] == "/echo?r=3"]
    assert seen[0]["headers"]["authorization"] == "Bearer recovery-v4lue"
    assert [e["path"] for e in audit] == ["/echo"]
    wait_for(lambda: not Path(f"/run/netns/{netns}").exists())


async def test_slots_of_a_vanished_server_are_collected(tmp_path: Path) -> None:
    """A server whose state directory is gone (a test run cleaned up without deleting its
    containers) cannot come back: the next server to start removes its namespaces."""
    from shellbox.egress.netns import NetnsPool

    gone = tmp_path / "gone-state"
    gone.mkdir()
    dead = NetnsPool(
        subnet="10.200.0.0/16", owner="dead-server", port=1, size=1, state_dir=str(gone)
    )
    await dead.start(keep=[])
    [index] = dead.owned()
    slot = dead.slot(index)
    assert dead.exists(slot)
    live = NetnsPool(
        subnet="10.200.0.0/16", owner="live-server", port=2, size=0, state_dir=str(tmp_path)
    )
    await live.start(keep=[])  # the dead server's directory still "exists": nothing happens
    assert dead.exists(slot)
    await live.close()
    gone.rmdir()
    await live.start(keep=[])
    try:
        assert not dead.exists(slot)
        assert index not in {i for i, c in live.claims().items() if c.owner == "dead-server"}
    finally:
        await live.close()
