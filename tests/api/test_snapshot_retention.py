"""Snapshot retention through the API, with real containers on btrfs: the per-project byte
quota and its refusal, a deleted snapshot whose bytes count while forks of it live (across a
restart), forks that keep their files when their snapshot is deleted, and expiry by last use."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from api_helpers import error_of, shell, wait_until

MIB = 1 << 20
# 10 MiB: one snapshot of a container holding a 6 MiB file fits, a second does not.
QUOTA_GIB = 10 / 1024
WRITE_6M = "head -c 6291456 /dev/urandom > /mnt/data/blob && sha256sum /mnt/data/blob"


@pytest.fixture
def http_of() -> Iterator[Any]:
    opened: list[httpx.Client] = []

    def make(srv: Any, key: str = "k") -> httpx.Client:
        client = httpx.Client(
            base_url=srv.root_url, headers={"authorization": f"Bearer {key}"}, timeout=120
        )
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def _stdout(http: httpx.Client, cid: str, command: str) -> str:
    out = shell(http, cid, command)["output"][0]
    assert out["outcome"] == {"type": "exit", "exit_code": 0}, out
    return str(out["stdout"])


def _container(http: httpx.Client, **body: Any) -> str:
    r = http.post("/v1/containers", json={"name": "c", **body})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def _snapshot(http: httpx.Client, cid: str) -> httpx.Response:
    return http.post(f"/v1/containers/{cid}/snapshots")


def test_snapshot_bytes_count_against_a_project_quota(server_factory: Any, http_of: Any) -> None:
    srv = server_factory(env={"SHELLBOX_LIMITS__MAX_SNAPSHOT_GB_PER_PROJECT": str(QUOTA_GIB)})
    http = http_of(srv)
    cid = _container(http)
    _stdout(http, cid, WRITE_6M)
    first = _snapshot(http, cid)
    assert first.status_code == 200, first.text
    held = first.json()["bytes"]
    assert 6 * MIB <= held < 10 * MIB
    r = _snapshot(http, cid)
    assert r.status_code == 429, r.text
    err = error_of(r)
    assert (err["type"], err["code"]) == ("rate_limit_error", "quota_exceeded")
    # It says the quota, the project's use, and what this snapshot would have added.
    assert f"holds {held / MIB:.1f} MiB ({held} bytes) of snapshots" in err["message"]
    assert "quota is 10.0 MiB (10485760 bytes)" in err["message"]
    assert "limits.max_snapshot_gb_per_project" in err["message"]
    assert "this snapshot holds" in err["message"]
    assert len(http.get("/v1/snapshots").json()["data"]) == 1  # nothing kept of the refused one
    stored = srv.view(srv.state_dir / "disks" / ".snapshots")
    assert [p.name for p in stored.iterdir()] == [first.json()["id"]]
    # Another project has its own quota.
    other = http_of(srv, "other-key")
    assert _snapshot(other, _container(other)).status_code == 200


def test_a_deleted_snapshot_counts_until_its_last_fork_is_gone(
    server_factory: Any, http_of: Any
) -> None:
    """Forks are btrfs snapshots of the snapshot: deleting it removes its subvolume at once
    and the forks keep every byte (checked by hash); what they share with it stays on disk
    while they live, so its bytes keep counting, across a restart, until the last one ends."""
    srv = server_factory(env={"SHELLBOX_LIMITS__MAX_SNAPSHOT_GB_PER_PROJECT": str(QUOTA_GIB)})
    http = http_of(srv)
    origin = _container(http)
    digest = _stdout(http, origin, WRITE_6M)
    sid = _snapshot(http, origin).json()["id"]
    forks = [_container(http, snapshot_id=sid) for _ in range(2)]
    http.delete(f"/v1/containers/{origin}")

    r = http.delete(f"/v1/snapshots/{sid}")
    assert r.status_code == 200, r.text
    assert http.get(f"/v1/snapshots/{sid}").status_code == 404  # the API stops showing it
    assert http.get("/v1/snapshots").json()["data"] == []
    assert not srv.view(srv.state_dir / "disks" / ".snapshots" / sid).exists()
    r = http.post("/v1/containers", json={"name": "late", "snapshot_id": sid})
    assert r.status_code == 404 and error_of(r)["param"] == "snapshot_id"
    for fork in forks:  # the forks' files are whole
        assert _stdout(http, fork, "sha256sum /mnt/data/blob") == digest

    # A fresh container's 6 MiB would fit the 10 MiB quota, but the deleted snapshot's
    # 6 MiB still count: the forks use them.
    fresh = _container(http)
    _stdout(http, fresh, WRITE_6M)

    def refused(cid: str) -> str:
        r = _snapshot(http, cid)
        assert r.status_code == 429, r.text
        return str(error_of(r)["message"])

    assert "of it deleted snapshots that live forks still use" in refused(fresh)
    srv.stop()
    srv.start()
    assert "of it deleted snapshots that live forks still use" in refused(fresh)
    http.delete(f"/v1/containers/{forks[1]}")
    refused(fresh)  # one fork still uses it
    refused(forks[0])  # (a snapshot of the fork would hold those 6 MiB too)
    assert _stdout(http, forks[0], "sha256sum /mnt/data/blob") == digest
    http.delete(f"/v1/containers/{forks[0]}")
    r = _snapshot(http, fresh)
    assert r.status_code == 200, r.text


def test_a_snapshot_of_a_fork_counts_what_the_fork_started_with(
    server_factory: Any, http_of: Any
) -> None:
    """Simple quotas charge a fork's disk only for its own writes; its snapshot still counts
    the data it shares, so deleting the first snapshot and the fork frees no quota while the
    second snapshot keeps that data on disk. (While both live, the shared data counts twice:
    the count is an upper bound.)"""
    quota_gib = 14 / 1024
    srv = server_factory(env={"SHELLBOX_LIMITS__MAX_SNAPSHOT_GB_PER_PROJECT": str(quota_gib)})
    http = http_of(srv)
    origin = _container(http)
    _stdout(http, origin, WRITE_6M)
    first = _snapshot(http, origin).json()
    fork = _container(http, snapshot_id=first["id"])
    http.delete(f"/v1/containers/{origin}")
    http.delete(f"/v1/snapshots/{first['id']}")  # held by the fork
    second = _snapshot(http, fork).json()
    assert second["bytes"] >= first["bytes"]
    http.delete(f"/v1/containers/{fork}")  # first is released; second holds the data
    fresh = _container(http)
    _stdout(http, fresh, "head -c 9437184 /dev/urandom > /mnt/data/blob")  # 6 + 9 > 14
    r = _snapshot(http, fresh)
    assert r.status_code == 429, r.text
    http.delete(f"/v1/snapshots/{second['id']}")
    assert _snapshot(http, fresh).status_code == 200


def test_snapshots_expire_when_unused_and_a_fork_counts_as_use(
    server_factory: Any, http_of: Any
) -> None:
    ttl_s = 3
    srv = server_factory(
        env={
            "SHELLBOX_LIFECYCLE__SNAPSHOT_EXPIRES_AFTER_DAYS": str(ttl_s / 86_400),
            "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
        }
    )
    http = http_of(srv)
    cid = _container(http)
    _stdout(http, cid, "echo kept > a.txt")
    snap = _snapshot(http, cid).json()
    assert snap["expires_at"] == snap["last_used_at"] + ttl_s
    time.sleep(1.1)
    fork = _container(http, snapshot_id=snap["id"])
    again = http.get(f"/v1/snapshots/{snap['id']}").json()
    assert again["last_used_at"] > snap["last_used_at"]  # the fork used it
    assert again["expires_at"] == again["last_used_at"] + ttl_s
    stored = srv.view(srv.state_dir / "disks" / ".snapshots" / snap["id"])
    assert stored.is_dir()

    def gone() -> bool:
        return http.get(f"/v1/snapshots/{snap['id']}").status_code == 404

    assert wait_until(gone, timeout_s=30)
    assert time.time() >= again["expires_at"]
    assert not stored.exists()
    assert _stdout(http, fork, "cat a.txt") == "kept\n"  # the fork keeps its files
    assert http.get("/v1/snapshots").json()["data"] == []
