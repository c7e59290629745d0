"""``shellbox.cluster.local``'s teardown (``scripts/cluster.sh`` without ``--keep``, and the
cluster lane's own): what every node held is destroyed before its directory goes, a node
that died included."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster_lane import remove_local_cluster, start_local_cluster
from shellbox.sandbox.cgroups import HostCgroups, detect_mode


@pytest.fixture
def small_cluster() -> Iterator[Any]:
    cluster = start_local_cluster("shellbox-teardown-", nodes=1, replicas=1)
    try:
        yield cluster
    finally:
        remove_local_cluster(cluster)


def processes_with(marker: str) -> list[int]:
    """Pids of this machine's processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # ended meanwhile
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_a_dead_nodes_containers_are_destroyed_before_its_directory_goes(
    small_cluster: Any,
) -> None:
    marker = str(7_000_000 + secrets.randbelow(1_000_000))  # a sleep no other process runs
    key = small_cluster.shellbox("keys", "create", "--project", "teardown")
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(base_url=small_cluster.root_url, timeout=120, headers=headers) as http:
        r = http.post("/v1/containers", json={"name": "left"})
        assert r.status_code == 200, r.text
        cid = r.json()["id"]
        call = {"type": "shell_call", "call_id": "c"}
        command = f"nohup sleep {marker} >/dev/null 2>&1 &"
        r = http.post(
            f"/v1/containers/{cid}/calls", json={**call, "action": {"commands": [command]}}
        )
        assert r.status_code == 200, r.text
    assert processes_with(f"sleep\0{marker}")
    cgroups = HostCgroups(detect_mode())
    assert cid in cgroups.existing()

    small_cluster.node(1).kill()  # its container runs on, as a restart would take it back
    assert processes_with(f"sleep\0{marker}")
    small_cluster.destroy_sandboxes()

    assert processes_with(f"sleep\0{marker}") == []
    assert cid not in cgroups.existing()
    assert not (small_cluster.root / "node1" / "containers" / cid).exists()
    assert f"destroyed 1 containers in {small_cluster.root / 'node1'}: {cid}" in (
        small_cluster.node(1).log()
    )
