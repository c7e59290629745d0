"""A cluster of real processes on this machine (``shellbox.cluster.local``: PostgreSQL, nodes
node1 and node2, API replicas api1 and api2, HAProxy round-robin): containers spread over the
nodes, any replica serves any container, a replica killed with ``kill -9`` costs nothing
acknowledged, a node killed with ``kill -9`` makes its containers answer 503 until it is back,
and two replicas put a container to sleep, or expire it, once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import delete, update

from cluster_lane import (
    NODE_TIMEOUT_S,
    SNAPSHOT_QUOTA_BYTES,
    remove_local_cluster,
    start_local_cluster,
)
from shellbox.sandbox.remote import RemoteRuntime, load_cluster_key
from shellbox.store import NodeStore, create_database
from shellbox.store.containers import SqlContainerStore
from shellbox.store.nodes import SqlNodeStore
from shellbox.store.tables import placements, snapshots
from waiting import wait_until

MIB = 1 << 20
WRITE_6M = "head -c 6291456 /dev/urandom > /mnt/data/blob && sha256sum /mnt/data/blob"


@pytest.fixture(scope="module")
def key(local_cluster: Any) -> str:
    return str(local_cluster.shellbox("keys", "create", "--project", "cluster"))


@pytest.fixture(scope="module")
def nodes(local_cluster: Any) -> Iterator[NodeStore]:
    db = create_database(local_cluster.database_url)
    yield SqlNodeStore(db)
    db.dispose()


def client(url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=120, headers={"authorization": f"Bearer {key}"})


def sdk(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def shell(http: httpx.Client, cid: str, command: str) -> httpx.Response:
    return http.post(
        f"/v1/containers/{cid}/calls",
        json={"type": "shell_call", "call_id": "c", "action": {"commands": [command]}},
    )


def stdout(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["output"][0]["stdout"])


def node_of(nodes: NodeStore, cid: str) -> str:
    node = nodes.node_of(cid)
    assert node is not None, cid
    return node.name


def on_node(local_cluster: Any, i: int) -> tuple[set[str], set[str]]:
    """(the containers, the stored snapshots) node ``i`` holds, asked of it directly."""

    async def ask() -> tuple[set[str], set[str]]:
        url = str(local_cluster.node(i).health_url).removesuffix("/healthz")
        node = RemoteRuntime(url, load_cluster_key(local_cluster.key_file))
        try:
            return {s.id for s in await node.list()}, set(await node.snapshot_ids())
        finally:
            await node.aclose()

    return asyncio.run(ask())


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_containers_spread_and_any_replica_serves_any_container(
    local_cluster: Any, key: str, nodes: NodeStore
) -> None:
    a, b = local_cluster.replica_url(1), local_cluster.replica_url(2)
    made = [sdk(a if i % 2 else b, key).containers.create(name=f"s{i}") for i in range(4)]
    try:
        assert sorted(node_of(nodes, c.id) for c in made) == ["node1", "node1", "node2", "node2"]
        with client(a, key) as via_a, client(b, key) as via_b:
            for c in made:
                # created through one replica, written through A, read and run through B
                up = via_a.post(
                    f"/v1/containers/{c.id}/files", files={"file": ("f.txt", c.id.encode())}
                )
                assert up.status_code == 200, up.text
                assert stdout(shell(via_b, c.id, "cat /mnt/data/f.txt")) == c.id
                content = via_b.get(f"/v1/containers/{c.id}/files/{up.json()['id']}/content")
                assert content.content == c.id.encode()
                listed = via_a.get(f"/v1/containers/{c.id}/files").json()["data"]
                assert [f["path"] for f in listed] == ["/mnt/data/f.txt"]
    finally:
        for c in made:
            sdk(a, key).containers.delete(c.id)


def test_kill_9_of_a_replica_costs_no_container_and_no_acknowledged_file(
    local_cluster: Any, key: str
) -> None:
    front = sdk(local_cluster.root_url, key)
    via_a = sdk(local_cluster.replica_url(1), key)
    c = via_a.containers.create(name="survivor")
    f = via_a.files.create(file=("blob.bin", b"x" * 300_000), purpose="user_data")
    cf = via_a.containers.files.create(c.id, file=("kept.txt", b"kept"))
    local_cluster.replica(1).kill()
    try:
        with client(local_cluster.root_url, key) as http:
            for _ in range(4):  # through HAProxy: the dead replica's share goes to the other
                assert c.id in {x.id for x in front.containers.list()}
                assert stdout(shell(http, c.id, "cat /mnt/data/kept.txt")) == "kept"
                got = front.containers.files.content.retrieve(cf.id, container_id=c.id)
                assert got.read() == b"kept"
                assert front.files.content(f.id).read() == b"x" * 300_000
            copied = http.post(f"/v1/containers/{c.id}/files", json={"file_id": f.id})
            assert copied.status_code == 200, copied.text
            assert stdout(shell(http, c.id, "wc -c < /mnt/data/blob.bin")).strip() == "300000"
    finally:
        local_cluster.replica(1).start()
        front.containers.delete(c.id)
        front.files.delete(f.id)


def test_kill_9_of_a_node_makes_its_containers_answer_503_until_it_is_back(
    local_cluster: Any, key: str, nodes: NodeStore
) -> None:
    front = sdk(local_cluster.root_url, key)
    made = [front.containers.create(name=f"n{i}") for i in range(2)]
    lost = next(c for c in made if node_of(nodes, c.id) == "node1")
    kept = next(c for c in made if node_of(nodes, c.id) == "node2")
    with client(local_cluster.root_url, key) as http:
        for c in made:
            assert shell(http, c.id, f"echo {c.id} > mine.txt").status_code == 200
        local_cluster.node(1).kill()
        killed_at = time.monotonic()
        try:

            def lost_for_the_cluster() -> bool:
                # At once the node refuses connections (503 from the remote runtime); within
                # the timeout the replicas take it for lost and answer without trying it.
                r = shell(http, lost.id, "cat mine.txt")
                assert r.status_code == 503, r.text
                return "'node1', which is unavailable" in r.json()["error"]["message"]

            assert wait_until(lost_for_the_cluster, NODE_TIMEOUT_S + 5)
            assert time.monotonic() - killed_at <= NODE_TIMEOUT_S + 5
            for _ in range(2):  # on both replicas, at once, without trying the node
                started = time.monotonic()
                r = shell(http, lost.id, "cat mine.txt")
                assert time.monotonic() - started < 2
                assert r.status_code == 503
                assert r.headers["x-should-retry"] == "true"
                err = r.json()["error"]
                assert err["code"] == "node_unavailable" and err["type"] == "server_error"
                assert "sandbox node 'node1', which is unavailable (no heartbeat" in err["message"]
            assert lost.id in {x.id for x in front.containers.list()}  # still listed
            assert front.containers.retrieve(lost.id).status == "running"
            assert stdout(shell(http, kept.id, "cat mine.txt")) == f"{kept.id}\n"
            fresh = [front.containers.create(name=f"f{i}") for i in range(2)]
            assert {node_of(nodes, c.id) for c in fresh} == {"node2"}
            for c in fresh:
                assert stdout(shell(http, c.id, "echo ok")) == "ok\n"
                front.containers.delete(c.id)
        finally:
            local_cluster.node(1).start()
        assert wait_until(lambda: shell(http, lost.id, "true").status_code == 200, 30)
        assert stdout(shell(http, lost.id, "cat mine.txt")) == f"{lost.id}\n"
    for c in made:
        front.containers.delete(c.id)


@pytest.fixture(scope="module")
def sleepy() -> Iterator[Any]:
    """A cluster whose containers sleep after 3 idle seconds and expire after 1 minute of 4
    seconds: one node, two replicas racing to do it."""
    cluster = start_local_cluster(
        "shellbox-sleepy-",
        nodes=1,
        env={"SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "3", "SHELLBOX_LIFECYCLE__MINUTE_S": "8"},
    )
    try:
        yield cluster
    finally:
        remove_local_cluster(cluster)


def test_two_replicas_put_a_container_to_sleep_and_expire_it_once(sleepy: Any) -> None:
    front = sdk(sleepy.root_url, "any")  # no keys: loopback, open
    c = front.containers.create(
        name="racing", expires_after={"anchor": "last_active_at", "minutes": 1}
    )
    assert wait_until(lambda: front.containers.retrieve(c.id).status == "sleeping", 20)
    assert wait_until(lambda: front.containers.retrieve(c.id).status == "expired", 30)
    time.sleep(2)  # a second sleep or expiry would be logged by now

    def said(what: str) -> int:
        logs = [sleepy.replica(i).log_path.read_text() for i in (1, 2)]
        return sum(text.count(f"container {c.id} {what}") for text in logs)

    assert (said("fell asleep"), said("expired")) == (1, 1)
    with contextlib.suppress(openai.NotFoundError):
        front.containers.delete(c.id)


def test_the_reaper_survives_the_death_of_its_replica(sleepy: Any) -> None:
    """The lease holder killed with ``kill -9``: the other replica takes the work over."""
    front = sdk(sleepy.root_url, "any")
    holder = next(
        i for i in (1, 2) if "took the reaper lease" in sleepy.replica(i).log_path.read_text()
    )
    sleepy.replica(holder).kill()
    try:
        c = front.containers.create(name="orphan")
        assert wait_until(lambda: front.containers.retrieve(c.id).status == "sleeping", 25)
    finally:
        sleepy.replica(holder).start()
    front.containers.delete(c.id)


def test_a_skill_uploaded_through_one_replica_is_mounted_through_the_other(
    local_cluster: Any, key: str, nodes: NodeStore
) -> None:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("greeter/SKILL.md", "---\nname: greeter\ndescription: Greets.\n---\nHi.\n")
        zf.writestr("greeter/hello.txt", "hello from the skill\n")
    bundle = buf.getvalue()
    via_a, via_b = sdk(local_cluster.replica_url(1), key), sdk(local_cluster.replica_url(2), key)
    skill = via_a.skills.create(files=("greeter.zip", bundle, "application/zip"))
    made = [
        via_b.containers.create(
            name=f"sk{i}", skills=[{"type": "skill_reference", "skill_id": skill.id}]
        )
        for i in range(2)
    ]
    try:
        assert all(node_of(nodes, c.id) in ("node1", "node2") for c in made)
        with client(local_cluster.root_url, key) as http:
            for c in made:
                assert stdout(shell(http, c.id, "cat /mnt/skills/greeter/hello.txt")) == (
                    "hello from the skill\n"
                )
        assert via_b.skills.content.retrieve(skill.id).read() == bundle
    finally:
        for c in made:
            via_a.containers.delete(c.id)
        via_b.skills.delete(skill.id)


def test_snapshots_forks_and_pause_through_either_replica(local_cluster: Any, nodes: Any) -> None:
    """A snapshot is stored on its container's node and every fork of it lands there (even
    where placement alone would pick the emptier node); pause and resume, snapshot quota and
    retention hold whichever replica answers: each reads what the other wrote to PostgreSQL."""
    key = local_cluster.shellbox("keys", "create", "--project", "snapshots")
    with (
        client(local_cluster.replica_url(1), key) as a,
        client(local_cluster.replica_url(2), key) as b,
    ):
        origin = ok(a.post("/v1/containers", json={"name": "origin"}))["id"]
        home = node_of(nodes, origin)
        digest = stdout(shell(b, origin, WRITE_6M))
        snap = ok(b.post(f"/v1/containers/{origin}/snapshots", json={"name": "six"}))
        assert 6 * MIB <= snap["bytes"] < SNAPSHOT_QUOTA_BYTES
        assert node_of(nodes, snap["id"]) == home
        assert snap["id"] in on_node(local_cluster, int(home[-1]))[1]
        forks = [
            ok(r.post("/v1/containers", json={"name": "fork", "snapshot_id": snap["id"]}))["id"]
            for r in (a, b)
        ]
        assert [node_of(nodes, f) for f in forks] == [home, home]
        for fork, via in zip(forks, (b, a), strict=True):
            assert stdout(shell(via, fork, "sha256sum /mnt/data/blob")) == digest

        paused = ok(a.post(f"/v1/containers/{forks[0]}/pause"))
        assert paused["status"] == "paused"
        assert ok(b.get(f"/v1/containers/{forks[0]}"))["status"] == "paused"
        assert ok(b.post(f"/v1/containers/{forks[0]}/resume"))["status"] == "running"
        assert ok(a.get(f"/v1/containers/{forks[0]}"))["status"] == "running"
        ok(b.post(f"/v1/containers/{forks[1]}/pause"))
        assert stdout(shell(a, forks[1], "echo thawed")) == "thawed\n"  # a call resumes
        assert ok(b.get(f"/v1/containers/{forks[1]}"))["status"] == "running"

        # The quota: what A stored counts on B.
        refused = a.post(f"/v1/containers/{origin}/snapshots")
        assert refused.status_code == 429, refused.text
        assert "limits.max_snapshot_gb_per_project" in refused.json()["error"]["message"]
        # Deleted through A: gone for B, and from its node; its bytes still count while the
        # forks (which share them) live.
        deleted = ok(a.delete(f"/v1/snapshots/{snap['id']}"))
        assert (deleted["id"], deleted["deleted"]) == (snap["id"], True)
        assert b.get(f"/v1/snapshots/{snap['id']}").status_code == 404
        assert snap["id"] not in on_node(local_cluster, int(home[-1]))[1]
        assert nodes.node_of(snap["id"]) is None
        ok(a.delete(f"/v1/containers/{origin}"))
        fresh = ok(b.post("/v1/containers", json={"name": "fresh"}))["id"]
        stdout(shell(a, fresh, WRITE_6M))
        held = b.post(f"/v1/containers/{fresh}/snapshots")
        assert held.status_code == 429, held.text
        assert "deleted snapshots that live forks still use" in held.json()["error"]["message"]
        for fork, via in zip(forks, (a, b), strict=True):
            ok(via.delete(f"/v1/containers/{fork}"))
        again = ok(a.post(f"/v1/containers/{fresh}/snapshots"))
        assert node_of(nodes, again["id"]) == node_of(nodes, fresh)
        ok(b.delete(f"/v1/snapshots/{again['id']}"))
        ok(b.delete(f"/v1/containers/{fresh}"))


def test_a_container_deleted_while_its_node_is_lost_is_gone_once_the_node_is_back(
    local_cluster: Any, nodes: Any
) -> None:
    """The delete succeeds at once (hidden, its memory no longer counted against its
    project); the node's sandbox is destroyed once the node runs again. A snapshot stored
    there likewise."""
    key = local_cluster.shellbox("keys", "create", "--project", "lost-delete")
    db = create_database(local_cluster.database_url)
    rows = SqlContainerStore(db)
    front = sdk(local_cluster.root_url, key)
    made = [front.containers.create(name=f"d{i}") for i in range(2)]
    doomed = next(c for c in made if node_of(nodes, c.id) == "node1")
    kept = next(c for c in made if node_of(nodes, c.id) == "node2")
    assert doomed.id in on_node(local_cluster, 1)[0]
    with client(local_cluster.root_url, key) as http:
        snap = ok(http.post(f"/v1/containers/{doomed.id}/snapshots"))["id"]
    assert snap in on_node(local_cluster, 1)[1]
    local_cluster.node(1).kill()
    try:
        with client(local_cluster.root_url, key) as http:

            def lost() -> bool:
                return "'node1', which is unavailable" in shell(http, doomed.id, "true").text

            assert wait_until(lost, NODE_TIMEOUT_S + 5)
            r = http.delete(f"/v1/containers/{doomed.id}")
            assert r.status_code == 200, r.text
            assert r.json()["deleted"] is True
            assert ok(http.delete(f"/v1/snapshots/{snap}"))["deleted"] is True
            for _ in range(2):  # both replicas
                assert http.get(f"/v1/snapshots/{snap}").status_code == 404
                assert http.get(f"/v1/containers/{doomed.id}").status_code == 404
                assert doomed.id not in {c.id for c in front.containers.list()}
            assert rows.usage("lost-delete").containers == 1  # only the kept one counts
            assert stdout(shell(http, kept.id, "echo on")) == "on\n"
    finally:
        local_cluster.node(1).start()
        db.dispose()
    assert wait_until(lambda: nodes.node_of(doomed.id) is None, 20)
    assert wait_until(lambda: nodes.node_of(snap) is None, 5)
    held, stored = on_node(local_cluster, 1)
    assert doomed.id not in held and snap not in stored
    front.containers.delete(kept.id)


def test_snapshots_a_node_stores_without_a_row_are_swept_once_it_is_back(
    local_cluster: Any, nodes: Any
) -> None:
    """What a replica that died while taking a snapshot leaves on the node (stored, placed,
    no row), and a stored snapshot the database has no trace of at all, are removed from the
    node by the reaper lease holder once the node is back; a listed snapshot stays, and so
    does one placed too recently to judge (it may be being taken)."""
    key = local_cluster.shellbox("keys", "create", "--project", "leftovers")
    db = create_database(local_cluster.database_url)
    try:
        with client(local_cluster.root_url, key) as http:
            cid = ok(http.post("/v1/containers", json={"name": "leftovers"}))["id"]
            home = int(node_of(nodes, cid)[-1])
            listed, placed_only, unknown, young = (
                ok(http.post(f"/v1/containers/{cid}/snapshots"))["id"] for _ in range(4)
            )
            with db.begin() as conn:  # the rows the crash never wrote, or a lost database
                gone = [placed_only, unknown, young]
                conn.execute(delete(snapshots).where(snapshots.c.id.in_(gone)))
                conn.execute(delete(placements).where(placements.c.id == unknown))
                conn.execute(
                    update(placements)
                    .where(placements.c.id == placed_only)
                    .values(created_at_ms=placements.c.created_at_ms - 3_600_000)
                )
            time.sleep(2)  # several reaper rounds: nothing is swept while the node runs on
            assert {listed, placed_only, unknown, young} <= on_node(local_cluster, home)[1]
            local_cluster.node(home).kill()
            local_cluster.node(home).start()

            def swept() -> bool:
                return not {placed_only, unknown} & on_node(local_cluster, home)[1]

            assert wait_until(swept, 20, step_s=0.5)
            assert {listed, young} <= on_node(local_cluster, home)[1]
            assert nodes.node_of(placed_only) is None
            assert nodes.node_of(young) is not None
            fork = ok(http.post("/v1/containers", json={"name": "f", "snapshot_id": listed}))
            assert stdout(shell(http, fork["id"], "echo forked")) == "forked\n"
            ok(http.delete(f"/v1/containers/{fork['id']}"))
            ok(http.delete(f"/v1/snapshots/{listed}"))
            ok(http.delete(f"/v1/containers/{cid}"))
    finally:
        db.dispose()

    async def remove_young() -> None:
        url = str(local_cluster.node(home).health_url).removesuffix("/healthz")
        node = RemoteRuntime(url, load_cluster_key(local_cluster.key_file))
        try:
            await node.delete_snapshot(young)
        finally:
            await node.aclose()

    asyncio.run(remove_young())
    nodes.unplace(young)
