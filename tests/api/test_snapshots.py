"""Snapshots and forks through the API, with real containers on btrfs: what a snapshot holds,
that forks are independent of each other, of their origin and of the snapshot, tenancy, the
per-project bound, deletion, and the answer of a server without copy-on-write storage."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_helpers import error_of, host_pids, shell

# A package installed the way ``pip install --user`` leaves one (no network needed).
SITE = "$HOME/.local/lib/python3.11/site-packages"
INSTALL = f"mkdir -p {SITE}/snappkg && echo 'VALUE = 42' > {SITE}/snappkg/__init__.py"
IMPORT = "python3 -c 'import snappkg; print(snappkg.VALUE)'"


OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


def _http(srv: Any, key: str) -> httpx.Client:
    client = httpx.Client(
        base_url=srv.root_url, headers={"authorization": f"Bearer {key}"}, timeout=120
    )
    OPEN.append(client)
    return client


def _stdout(http: httpx.Client, cid: str, command: str) -> str:
    out = shell(http, cid, command)["output"][0]
    assert out["outcome"] == {"type": "exit", "exit_code": 0}, out
    return str(out["stdout"])


def _fork(http: httpx.Client, snapshot_id: str, name: str = "fork") -> str:
    r = http.post("/v1/containers", json={"name": name, "snapshot_id": snapshot_id})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "running"
    return str(r.json()["id"])


@pytest.fixture(scope="module")
def srv(server_factory: Any) -> Any:
    srv = server_factory(start=False, env={"SHELLBOX_LIMITS__MAX_SNAPSHOTS_PER_PROJECT": "6"})
    srv.env["KEY_A"] = srv.create_key("proj-a")
    srv.env["KEY_B"] = srv.create_key("proj-b")
    return srv.start()


def test_forks_see_the_snapshot_and_only_their_own_writes(srv: Any) -> None:
    http = _http(srv, srv.env["KEY_A"])
    sdk = openai.OpenAI(base_url=srv.base_url, api_key=srv.env["KEY_A"], max_retries=0)
    origin = sdk.containers.create(name="origin").id
    marker = f"bg-{secrets.token_hex(5)}"
    _stdout(http, origin, f"echo data > /mnt/data/a.txt && {INSTALL}")
    _stdout(http, origin, "echo scratch > /tmp/t.txt")
    shell(http, origin, f"(exec -a {marker} sleep 1000) &")
    running = host_pids(marker)
    assert running

    r = http.post(f"/v1/containers/{origin}/snapshots", json={"name": "prepared"})
    assert r.status_code == 200, r.text
    snap = r.json()
    assert snap["object"] == "container.snapshot" and snap["id"].startswith("snap_")
    assert (snap["container_id"], snap["name"], snap["status"]) == (origin, "prepared", "ready")
    assert snap["bytes"] > 0
    # The origin kept running through it: the same background process, and it answers.
    assert host_pids(marker) == running
    assert _stdout(http, origin, "cat /mnt/data/a.txt") == "data\n"
    assert sdk.containers.retrieve(origin).status == "running"

    forks = [_fork(http, snap["id"], f"fork{i}") for i in range(3)]
    for fork in forks:
        assert _stdout(http, fork, "cat /mnt/data/a.txt") == "data\n"
        assert _stdout(http, fork, IMPORT) == "42\n"
        assert _stdout(http, fork, "ls /tmp") == ""  # /tmp is not part of a snapshot
        # Its files are its own user's, inside and (its own uid range) on the host.
        assert _stdout(http, fork, "stat -c %U:%G /mnt/data/a.txt ~/.local") == (
            "user:user\nuser:user\n"
        )
        on_host = srv.view(srv.data_dir(fork)) / "a.txt"
        origin_file = srv.view(srv.data_dir(origin)) / "a.txt"
        assert on_host.stat().st_uid != origin_file.stat().st_uid
    assert host_pids(marker) == running  # files are forked, processes are not

    _stdout(http, forks[0], f"echo fork0 > /mnt/data/a.txt && echo new > {SITE}/snappkg/x")
    for other in (*forks[1:], origin):
        assert _stdout(http, other, "cat /mnt/data/a.txt") == "data\n"
        assert _stdout(http, other, f"ls {SITE}/snappkg") == "__init__.py\n"
    # The snapshot is unchanged too, and outlives its container.
    sdk.containers.delete(origin)
    late = _fork(http, snap["id"], "late")
    assert _stdout(http, late, "cat /mnt/data/a.txt") == "data\n"
    assert _stdout(http, late, f"ls {SITE}/snappkg") == "__init__.py\n"
    assert _stdout(http, forks[0], "cat /mnt/data/a.txt") == "fork0\n"

    # Listed, retrieved, deleted with its storage; the forks keep their files.
    listed = http.get("/v1/snapshots").json()
    assert snap["id"] in [s["id"] for s in listed["data"]]
    assert http.get(f"/v1/snapshots/{snap['id']}").json()["id"] == snap["id"]
    stored = srv.view(srv.state_dir / "disks" / ".snapshots" / snap["id"])
    assert stored.is_dir()
    r = http.delete(f"/v1/snapshots/{snap['id']}")
    assert r.json() == {"id": snap["id"], "object": "container.snapshot.deleted", "deleted": True}
    assert not stored.exists()
    assert http.get(f"/v1/snapshots/{snap['id']}").status_code == 404
    assert _stdout(http, forks[1], "cat /mnt/data/a.txt") == "data\n"
    for cid in (*forks, late):
        sdk.containers.delete(cid)


def test_another_project_cannot_see_fork_or_delete_a_snapshot(srv: Any) -> None:
    a, b = _http(srv, srv.env["KEY_A"]), _http(srv, srv.env["KEY_B"])
    cid = a.post("/v1/containers", json={"name": "mine"}).json()["id"]
    snap = a.post(f"/v1/containers/{cid}/snapshots").json()  # no body: no name
    assert snap["name"] is None
    assert b.get(f"/v1/snapshots/{snap['id']}").status_code == 404
    assert snap["id"] not in [s["id"] for s in b.get("/v1/snapshots").json()["data"]]
    r = b.post("/v1/containers", json={"name": "theirs", "snapshot_id": snap["id"]})
    assert r.status_code == 404, r.text
    assert (error_of(r)["code"], error_of(r)["param"]) == ("snapshot_not_found", "snapshot_id")
    r = b.delete(f"/v1/snapshots/{snap['id']}")
    assert r.status_code == 404 and error_of(r)["code"] == "snapshot_not_found"
    r = b.post(f"/v1/containers/{cid}/snapshots")  # nor snapshot a container of A's
    assert r.status_code == 404 and error_of(r)["code"] == "container_not_found"
    assert a.get(f"/v1/snapshots/{snap['id']}").status_code == 200
    assert a.delete(f"/v1/snapshots/{snap['id']}").status_code == 200
    a.delete(f"/v1/containers/{cid}")


def test_a_project_keeps_a_bounded_number_of_snapshots(srv: Any) -> None:
    http = _http(srv, srv.env["KEY_B"])
    cid = http.post("/v1/containers", json={"name": "many"}).json()["id"]
    taken = [http.post(f"/v1/containers/{cid}/snapshots").json()["id"] for _ in range(6)]
    r = http.post(f"/v1/containers/{cid}/snapshots")
    assert r.status_code == 429, r.text
    assert "limits.max_snapshots_per_project" in error_of(r)["message"]
    assert len(http.get("/v1/snapshots", params={"limit": 100}).json()["data"]) == 6
    for sid in taken:
        http.delete(f"/v1/snapshots/{sid}")
    assert http.post(f"/v1/containers/{cid}/snapshots").status_code == 200
    http.delete(f"/v1/containers/{cid}")


def test_a_fork_of_a_fork_and_its_quota(srv: Any) -> None:
    http = _http(srv, srv.env["KEY_A"])
    cid = http.post("/v1/containers", json={"name": "gen0"}).json()["id"]
    _stdout(http, cid, "echo 0 > gen && ln -s gen link && chmod u+s gen")
    first = http.post(f"/v1/containers/{cid}/snapshots").json()["id"]
    gen1 = _fork(http, first)
    assert _stdout(http, gen1, "stat -c %A:%U gen") == "-rwSr--r--:user\n"  # set-uid kept
    _stdout(http, gen1, "echo 1 >> gen")  # (a write clears it, as anywhere)
    second = http.post(f"/v1/containers/{gen1}/snapshots").json()["id"]
    gen2 = _fork(http, second)
    assert _stdout(http, gen2, "cat link; stat -c %U link") == "0\n1\nuser\n"
    # The fork has the disk quota a new container has (its writes past it fail).
    out = shell(http, gen2, "fallocate -l 20G big")["output"][0]
    assert "Disk quota exceeded" in out["stderr"] or "No space" in out["stderr"], out
    for c in (cid, gen1, gen2):
        http.delete(f"/v1/containers/{c}")
    for s in (first, second):
        http.delete(f"/v1/snapshots/{s}")


def test_plain_directory_storage_answers_501(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_STORAGE__BACKEND": "none"})
    http = _http(srv, "k")
    cid = http.post("/v1/containers", json={"name": "plain"}).json()["id"]
    r = http.post(f"/v1/containers/{cid}/snapshots", json={"name": "x"})
    assert r.status_code == 501, r.text
    err = error_of(r)
    assert err["code"] == "snapshots_unavailable" and 'storage.backend = "none"' in err["message"]
    assert http.get("/v1/snapshots").json()["data"] == []
    r = http.post("/v1/containers", json={"name": "f", "snapshot_id": "snap_nope"})
    assert r.status_code == 404 and error_of(r)["param"] == "snapshot_id"
    assert not Path(srv.state_dir / "disks" / ".snapshots").exists()
    http.delete(f"/v1/containers/{cid}")


def test_server_restart_keeps_snapshots_and_forks(server_factory: Any) -> None:
    first = server_factory()
    http = _http(first, "k")
    cid = http.post("/v1/containers", json={"name": "before"}).json()["id"]
    _stdout(http, cid, "echo kept > k.txt")
    sid = http.post(f"/v1/containers/{cid}/snapshots").json()["id"]
    fork = _fork(http, sid)
    first.kill()
    second = server_factory(state_dir=first.state_dir)
    http = _http(second, "k")
    assert http.get(f"/v1/snapshots/{sid}").status_code == 200
    assert _stdout(http, fork, "cat k.txt") == "kept\n"
    again = _fork(http, sid)
    assert _stdout(http, again, "cat k.txt") == "kept\n"
    assert os.path.isdir(second.view(second.state_dir / "disks" / ".snapshots" / sid))


def test_a_snapshot_whose_storage_is_gone_is_a_404_and_leaves_nothing(srv: Any) -> None:
    """Deleted meanwhile, or taken on another server sharing the database: a fork of it is a
    404 naming snapshot_id, not a 500, and the half-made container is gone."""
    http = _http(srv, srv.env["KEY_A"])
    cid = http.post("/v1/containers", json={"name": "src"}).json()["id"]
    sid = http.post(f"/v1/containers/{cid}/snapshots").json()["id"]
    stored = srv.state_dir / "disks" / ".snapshots" / sid
    delete = ["btrfs", "-q", "subvolume", "delete", str(stored)]
    subprocess.run(["nsenter", f"--mount={srv.mount_namespace()}", *delete], check=True)
    before = {c["id"] for c in http.get("/v1/containers", params={"limit": 100}).json()["data"]}
    disks = srv.view(srv.state_dir / "disks")
    disks_before = {p.name for p in disks.iterdir()}
    r = http.post("/v1/containers", json={"name": "orphan", "snapshot_id": sid})
    assert r.status_code == 404, r.text
    err = error_of(r)
    assert (err["code"], err["param"]) == ("snapshot_not_found", "snapshot_id")
    assert "not stored on this server" in err["message"]
    after = {c["id"] for c in http.get("/v1/containers", params={"limit": 100}).json()["data"]}
    assert after == before
    assert {p.name for p in disks.iterdir()} <= disks_before  # (the warm pool may take one)
    http.delete(f"/v1/snapshots/{sid}")
    http.delete(f"/v1/containers/{cid}")
