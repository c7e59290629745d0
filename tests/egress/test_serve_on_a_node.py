"""``shellbox serve`` whose sandboxes run on a ``shellbox node`` (``cluster.node_url``): the
API works the same through ``RemoteRuntime`` (containers, calls plain and streamed,
container files both ways, a skill, an allowlist with a secret), and nothing of a sandbox is
on the API server's disk. Here beside the egress tests for their local "internet"."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from egress_helpers import Upstream, run, wait_for
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect

from node_helpers import NodeProcess, make_state_dir

SECRET = "node-s3cret-value"


@pytest.fixture(scope="module")
def on_node(
    server_factory: Callable[..., Any], upstream: Upstream
) -> Iterator[tuple[Any, NodeProcess]]:
    server = server_factory(start=False)
    server.env["SHELLBOX_TEST_KEY"] = server.create_key("on-node")  # (makes its database)
    node_state = make_state_dir("shellbox-node-api-")
    node = NodeProcess(
        node_state,
        env={
            "SHELLBOX_EGRESS__UPSTREAM_CA": json.dumps([str(upstream.ca)]),
            "SHELLBOX_EGRESS__HOSTS_FILE": str(upstream.hosts_file),
        },
        # its egress audit goes to the API server's database
        args=["--database-url", server.database_url],
    ).start()
    server.env["SHELLBOX_CLUSTER__NODE_URL"] = node.url
    server.env["SHELLBOX_CLUSTER__KEY_FILE"] = str(node.key_file)
    server.start()
    yield server, node
    server.stop()
    try:
        node.destroy_all()
    finally:
        node.stop()
        shutil.rmtree(node_state, ignore_errors=True)


@pytest.fixture(scope="module")
def http(on_node: tuple[Any, NodeProcess]) -> Iterator[httpx.Client]:
    server, _ = on_node
    auth = {"authorization": f"Bearer {server.env['SHELLBOX_TEST_KEY']}"}
    with httpx.Client(base_url=server.root_url, headers=auth, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def client(on_node: tuple[Any, NodeProcess]) -> Any:
    server, _ = on_node
    return openai.OpenAI(
        base_url=server.base_url, api_key=server.env["SHELLBOX_TEST_KEY"], max_retries=0
    )


def test_containers_calls_and_files_run_on_the_node(
    on_node: tuple[Any, NodeProcess], client: Any, http: httpx.Client
) -> None:
    server, node = on_node
    c = client.containers.create(name="on-node")
    assert (node.state_dir / "containers" / c.id / "spec.json").exists()
    assert not (server.state_dir / "containers" / c.id).exists()
    [plain] = run(http, c.id, "echo plain; echo err >&2")
    assert (plain["stdout"], plain["stderr"]) == ("plain\n", "err\n")
    body = {"type": "shell_call", "action": {"commands": ["echo a; sleep 1; echo b"]}}
    kinds = []
    with http.stream("POST", f"/v1/containers/{c.id}/calls?stream=true", json=body) as r:
        assert r.status_code == 200
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        kinds = [e["type"] for e in data]
    deltas = [e["delta"].get("stdout", "") for e in data if e["type"].endswith("content.delta")]
    assert "".join(deltas) == "a\nb\n" and kinds[-1] == "response.output_item.done"

    big = bytes(range(256)) * 8192  # 2 MiB, streamed both ways
    up = client.containers.files.create(c.id, file=("in/big.bin", big))
    assert up.path == "/mnt/data/in/big.bin" and up.bytes == len(big)
    [made] = run(http, c.id, "sha256sum < /mnt/data/in/big.bin | cut -c1-16; echo hi > out.txt")
    assert made["outcome"]["exit_code"] == 0
    assert client.containers.files.content.retrieve(up.id, container_id=c.id).read() == big
    listed = {f.path: f for f in client.containers.files.list(c.id)}
    out = listed["/mnt/data/out.txt"]
    assert client.containers.files.content.retrieve(out.id, container_id=c.id).read() == b"hi\n"
    # A driver's error crosses as its own: the API answers it as a local runtime's.
    r = http.get(f"/v1/containers/{c.id}/files/cfile_nosuchfile/content")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    client.containers.delete(c.id)
    wait_for(lambda: not (node.state_dir / "containers" / c.id).exists())


def test_a_skill_is_mounted_from_the_node(
    on_node: tuple[Any, NodeProcess], client: Any, http: httpx.Client
) -> None:
    _, node = on_node
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("SKILL.md", "---\nname: remote\ndescription: On a node.\n---\nHello.\n")
    skill = client.skills.create(files=("remote.zip", buf.getvalue()))
    c = client.containers.create(
        name="skilled", skills=[{"type": "skill_reference", "skill_id": skill.id}]
    )
    [out, index] = run(http, c.id, "cat /mnt/skills/remote/SKILL.md", "cat /mnt/skills/index.json")
    assert out["stdout"].endswith("Hello.\n")
    assert json.loads(index["stdout"])["data"][0]["skill_id"] == skill.id
    assert (node.state_dir / "skill-layouts" / f"{skill.id}.1" / "SKILL.md").is_file()
    client.containers.delete(c.id)
    client.skills.delete(skill.id)
    assert not (node.state_dir / "skill-layouts" / f"{skill.id}.1").exists()


def test_an_allowlist_is_enforced_by_the_node(
    on_node: tuple[Any, NodeProcess], http: httpx.Client, upstream: Upstream
) -> None:
    policy = {
        "type": "allowlist",
        "allowed_domains": ["api.example.test"],
        "domain_secrets": [{"domain": "api.example.test", "name": "TOKEN", "value": SECRET}],
    }
    r = http.post("/v1/containers", json={"name": "egress-node", "network_policy": policy})
    assert r.status_code == 200, r.text
    cid = r.json()["id"]
    upstream.clear()
    allowed, refused = run(
        http,
        cid,
        'curl -sS -m 20 -H "Authorization: Bearer $TOKEN" https://api.example.test/echo',
        "curl -sS -m 20 -o /dev/null -w '%{http_code}' https://other.example.test/",
    )
    assert json.loads(allowed["stdout"])["tls"] is True, allowed
    assert refused["stdout"] == "000" and "403" in refused["stderr"], refused
    assert [s["headers"]["authorization"] for s in upstream.seen()] == [f"Bearer {SECRET}"]

    def audited() -> bool:
        events = http.get(f"/v1/containers/{cid}/egress", params={"limit": 100}).json()["data"]
        return {"api.example.test", "other.example.test"} <= {e["host"] for e in events}

    wait_for(audited)  # written by the node into the same database
    assert http.delete(f"/v1/containers/{cid}").status_code == 200


def test_a_service_and_a_terminal_in_a_container_on_the_node(
    on_node: tuple[Any, NodeProcess], client: Any, http: httpx.Client
) -> None:
    server, _ = on_node
    c = client.containers.create(name="on-node-streams")
    [up] = run(
        http,
        c.id,
        "mkdir -p site && head -c 3000000 /dev/urandom > site/blob && sha256sum site/blob"
        " | cut -c1-64 && cd site && nohup python3 -m http.server 8000 --bind 127.0.0.1"
        " >/dev/null 2>&1 &",
    )
    digest = up["stdout"].strip()
    wait_for(lambda: http.get(f"/v1/containers/{c.id}/ports/8000/").status_code == 200)
    blob = http.get(f"/v1/containers/{c.id}/ports/8000/blob")  # relayed by the node
    assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == digest
    nothing = http.get(f"/v1/containers/{c.id}/ports/8999/")
    assert nothing.status_code == 502  # PortNotListening crossed as itself

    key = server.env["SHELLBOX_TEST_KEY"]
    url = f"ws://127.0.0.1:{server.port}/v1/containers/{c.id}/pty?cols=70&rows=20"
    with connect(url, additional_headers={"authorization": f"Bearer {key}"}) as ws:
        ws.send(b"stty size; exit 5\n")
        seen, exit_message = b"", None
        with contextlib.suppress(ConnectionClosedOK):
            while True:
                message = ws.recv(timeout=20)
                if isinstance(message, bytes):
                    seen += message
                else:
                    exit_message = json.loads(message)
    assert b"20 70" in seen, seen
    assert exit_message == {"type": "exit", "exit_code": 5}
    client.containers.delete(c.id)
