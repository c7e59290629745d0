"""A node as the DaemonSet runs it serves https with the certificate of the Secret
``shellbox-node-tls``, made by the openssl commands of deploy/kubernetes/README.md ("Node TLS")
as written; an API replica holding that Secret's ``ca.crt`` where the Deployment mounts it
accepts the node under the name it advertises.

The pods' parts taken from the rendered manifests, not restated here: the node container's
``SHELLBOX_*`` variables and ``--advertise``; where each container mounts which items of the
Secret, and at what mode (written as the kubelet writes them, under a temporary root instead of
/). What a pod has that this does not: the pod's DNS name (the connection goes to 127.0.0.1 and
the TLS check uses the advertised name, as a replica's would after resolving it).
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from k8s_manifests import render

from node_helpers import NodeProcess
from process_helpers import make_state_dir, remove_state_dir

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
README = ROOT / "README.md"
SECRET = "shellbox-node-tls"
POD = {"POD_NAME": "shellbox-node-x7k2p", "POD_NAMESPACE": "shellbox"}


def readme_openssl_commands() -> str:
    """The README's shell lines under "With openssl", up to the kubectl command (which needs a
    cluster)."""
    text = README.read_text()
    block = text.split("With openssl", 1)[1].split("With cert-manager", 1)[0]
    lines = [line[4:] for line in block.splitlines() if line.startswith("    ")]
    script = "\n".join(lines)
    script = script[: script.index("kubectl ")]
    assert "openssl" in script
    return script


def pod_container(kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    workload = next(m for m in render(ROOT) if m["kind"] == kind)
    pod = workload["spec"]["template"]
    return pod, pod["spec"]["containers"][0]


def kubelet_mount(pod: dict[str, Any], container: dict[str, Any], data: dict[str, bytes],
                  root: Path) -> list[Path]:  # fmt: skip
    """Write the container's items of the Secret under ``root`` as the kubelet would: at the
    mount path, with the item's mode or the volume's defaultMode."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    written = []
    for mount in container["volumeMounts"]:
        secret = volumes[mount["name"]].get("secret")
        if not secret or secret["secretName"] != SECRET:
            continue
        for item in secret["items"]:
            path = root / mount["mountPath"].lstrip("/") / item["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data[item["key"]])
            path.chmod(item.get("mode", secret.get("defaultMode", 0o644)))
            written.append(path)
    return written


def expand(arg: str) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: POD[m.group(1)], arg)


@pytest.fixture
def state() -> Iterator[Path]:
    path = make_state_dir("shellbox-k8s-tls-")
    yield path
    remove_state_dir(path)


def test_a_node_as_deployed_serves_https_the_replicas_trust(state: Path) -> None:
    made = state / "openssl"
    made.mkdir()
    subprocess.run(["bash", "-e", "-c", readme_openssl_commands()], cwd=made, check=True,
                   capture_output=True, timeout=60)  # fmt: skip
    data = {key: (made / key).read_bytes() for key in ("tls.crt", "tls.key", "ca.crt")}

    root = state / "root"
    node_pod, node = pod_container("DaemonSet")
    api_pod, api = pod_container("Deployment")
    assert {p.name for p in kubelet_mount(node_pod, node, data, root)} == {"tls.crt", "tls.key"}
    assert {p.name for p in kubelet_mount(api_pod, api, data, root)} == {"ca.crt"}
    env = {
        e["name"]: str(root) + e["value"]  # every literal one names a mounted file
        for e in node["env"]
        if e["name"].startswith("SHELLBOX_") and "value" in e
    }
    assert set(env) == {"SHELLBOX_CLUSTER__TLS_CERT_FILE", "SHELLBOX_CLUSTER__TLS_KEY_FILE"}
    (advertise,) = [expand(a) for a in node["args"] if a.startswith("--advertise=")]
    url = advertise.removeprefix("--advertise=")
    host = urlsplit(url).hostname
    assert url == f"https://{host}:8001"
    assert host == "shellbox-node-x7k2p.shellbox-node.shellbox.svc"

    proc = NodeProcess(state, env=env, args=[advertise])
    try:
        # Up as the kubelet's readiness probe sees it: https, the certificate not checked.
        probe = node["readinessProbe"]["httpGet"]
        assert probe["scheme"] == "HTTPS"
        health = f"https://127.0.0.1:{proc.port}{probe['path']}"
        proc.launch(proc.command(), proc.environment(), proc.log_path, health, 60, verify=False)
        assert f"(advertised as {url})" in proc.log()

        ca = next(e["value"] for e in api["env"] if e["name"] == "SHELLBOX_CLUSTER__NODE_CA_FILE")
        replica = ssl.create_default_context(cafile=str(root) + ca)
        assert healthz(replica, proc.port, host).startswith(b"HTTP/1.1 200")
        for other in ("shellbox-node-x7k2p.shellbox-node.other.svc", "127.0.0.1"):
            with pytest.raises(ssl.SSLCertVerificationError, match="match"):
                healthz(replica, proc.port, other)
    finally:
        proc.stop()


def healthz(context: ssl.SSLContext, port: int, name: str) -> bytes:
    """GET /healthz from 127.0.0.1:port, checking its certificate for ``name``."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=name) as tls,
    ):
        tls.sendall(f"GET /healthz HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := tls.recv(4096):
            answer += chunk
    return answer
