"""A cluster of real processes on this machine (``shellbox.cluster.local``: PostgreSQL, nodes
node1 and node2, API replicas api1 and api2, HAProxy round-robin): containers spread over the
nodes, any replica serves any container, a replica killed with ``kill -9`` costs nothing
acknowledged, a node killed with ``kill -9`` makes its containers answer 503 until it is back,
and two replicas put a container to sleep, or expire it, once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from cluster_lane import NODE_TIMEOUT_S, remove_local_cluster, start_local_cluster
from shellbox.store import NodeStore, create_database
from shellbox.store.nodes import SqlNodeStore


def wait_until(predicate: Any, timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


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
