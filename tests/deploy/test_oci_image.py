"""The OCI image of scripts/image.sh runs both roles.

The API role: started with podman as the API Deployment
(deploy/kubernetes/base/api-deployment.yaml) starts it, against a throwaway PostgreSQL, it
answers 200 on /healthz, the readiness probe's path.

Differences from the Deployment, each for a reason:
- it listens on 127.0.0.1 (host network), not 0.0.0.0: no test traffic leaves this machine,
  and a server with no API key listens only on loopback;
- the Deployment's security context, as podman says it: uid 0 with every capability
  dropped, no new privileges, a read-only root filesystem, and the Secret's files 0400.

The node role: in a container with what the node DaemonSet
(deploy/kubernetes/base/node-daemonset.yaml) gives its pod (privileged, its hostPaths), the
image's own crun, btrfs and agent run a real sandbox command with a disk quota, for a caller
that presents the cluster key, through `RemoteRuntime` as an API replica would.

The image is built (or found cached) by scripts/image.sh, which scripts/test.sh runs first.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography.fernet import Fernet
from sqlalchemy import make_url

import pg_helpers as postgres
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, hostns
from shellbox.sandbox.remote import RemoteRuntime
from tls_helpers import make_tls

REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = REPO / "deploy" / "kubernetes" / "base" / "api-deployment.yaml"
DAEMONSET = REPO / "deploy" / "kubernetes" / "base" / "node-daemonset.yaml"
CONFIGMAP = REPO / "deploy" / "kubernetes" / "base" / "configmap.yaml"
IMAGES = REPO / ".state" / "images"
STARTUP_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def image() -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / "image.sh")], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def database() -> Iterator[tuple[postgres.Cluster, str]]:
    cluster = postgres.start_cluster()
    try:
        yield cluster, cluster.new_database()
    finally:
        cluster.stop()


def api_container() -> dict:
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def podman_args(container: dict, port: int) -> list[str]:
    """The Deployment's args, listening on this host's loopback (see the module's docstring)."""
    out = []
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        out.append({"--host": "--host=127.0.0.1", "--port": f"--port={port}"}.get(flag, arg))
    return out


# runc: crun 1.8 refuses this host's hybrid cgroups. The limits: root here may not raise
# them to podman's defaults (no CAP_SYS_RESOURCE).
PODMAN_RUN = (
    "podman", "run", "--runtime", "runc",
    "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096",
)  # fmt: skip


def test_api_role_from_the_image_answers_healthz(
    image: str, database: tuple[postgres.Cluster, str], tmp_path: Path
) -> None:
    cluster, url = database
    # Its socket's directory, for a root with no CAP_DAC_OVERRIDE (the data stays 0700).
    cluster.root.chmod(0o711)
    container = api_container()
    port = free_port()
    settings = yaml.safe_load(CONFIGMAP.read_text())["data"]
    key_dir = tmp_path / "secrets"  # what the shellbox-keys Secret holds
    key_dir.mkdir()
    for name, value in (
        ("secrets.key", Fernet.generate_key().decode()),
        ("cluster-key", os.urandom(32).hex()),
    ):
        (key_dir / name).write_text(value)
        (key_dir / name).chmod(0o400)  # the Secret volume's defaultMode
    env = {
        **settings,
        "SHELLBOX_STORE__DATABASE_URL": url,  # the Secret's `url`, by the same variable
    }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    name = f"shellbox-test-api-{uuid.uuid4().hex[:8]}"
    argv = [
        *PODMAN_RUN, "--detach", "--name", name, "--network", "host",
        "--read-only", "--cap-drop", "all", "--security-opt", "no-new-privileges",
        "--tmpfs", mounts["tmp"], "--tmpfs", mounts["state"],
        "--volume", f"{key_dir}:{mounts['keys']}:ro",
        "--volume", f"{cluster.root}:{cluster.root}",  # the database's Unix socket
        *(f"--env={k}={v}" for k, v in env.items()),
        "--entrypoint", container["command"][0],
        image, *podman_args(container, port),
    ]  # fmt: skip
    started = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + STARTUP_S
        answer = None
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
                break
            except httpx.TransportError:
                state = subprocess.run(
                    ["podman", "inspect", "--format", "{{.State.Running}}", name],
                    capture_output=True,
                    text=True,
                )
                assert state.stdout.strip() == "true", "the container stopped: " + logs(name)
                time.sleep(0.5)
        assert answer is not None, f"no answer within {STARTUP_S} s: " + logs(name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "ok"
        # It used the database the Secret names, not a SQLite file of its own.
        database_name = str(make_url(url).database)
        assert cluster.psql("SELECT count(*) FROM alembic_version", database_name).strip() == "1"
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "5", name], capture_output=True)


def logs(name: str) -> str:
    out = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
    return (out.stdout + out.stderr)[-3000:]


def node_args(container: dict, port: int, state: Path) -> list[str]:
    """The DaemonSet's args with the pod's address and name filled in as the kubelet does,
    listening on this host's loopback, with a state directory of the test's own."""
    own = {
        "--listen": f"--listen=127.0.0.1:{port}",
        "--advertise": f"--advertise=https://127.0.0.1:{port}",
        "--name": "--name=test-node",
        "--state-dir": f"--state-dir={state}",
    }
    return [own.get(arg.split("=", 1)[0], arg) for arg in container["args"]]


def test_node_role_from_the_image_runs_a_sandbox(image: str, tmp_path: Path) -> None:
    """`shellbox node`, run as the DaemonSet runs it, answers /healthz without the key and
    runs a real sandbox (uid 1000, its btrfs disk with a quota) for a caller with the key,
    over https with the certificate and key of the Secret shellbox-node-tls, mounted and set
    as the DaemonSet mounts and sets them (the certificate names 127.0.0.1 here, where the
    pod's names its DNS name: test_kubernetes_node_tls.py checks that one)."""
    daemonset = yaml.safe_load(DAEMONSET.read_text())
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["securityContext"] == {"privileged": True}
    host_paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for volume in pod["volumes"]:  # as the kubelet does for these
        if volume.get("hostPath", {}).get("type") == "DirectoryOrCreate":
            Path(volume["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)
    # A state directory of its own rather than this shared machine's /var/lib/shellbox, at the
    # same path inside (the runtime's /run/shellbox/<key> is keyed by that path).
    state = Path(tempfile.mkdtemp(prefix="shellbox-test-node-", dir="/var/tmp"))
    state.chmod(0o711)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    key_dir = tmp_path / "secrets"  # what the shellbox-keys Secret holds
    key_dir.mkdir()
    key = os.urandom(32).hex()
    (key_dir / "cluster-key").write_text(key)
    (key_dir / "cluster-key").chmod(0o400)
    volumes = [f"{key_dir}:{mounts['keys']}:ro"] if "keys" in mounts else []
    tls = make_tls(tmp_path)
    secret = {"tls.crt": tls.cert.read_bytes(), "tls.key": tls.key.read_bytes()}
    for volume in pod["volumes"]:  # the Secret shellbox-node-tls's items, as the kubelet writes
        if volume.get("secret", {}).get("secretName") == "shellbox-node-tls":
            tls_dir = tmp_path / volume["name"]
            tls_dir.mkdir()
            for item in volume["secret"]["items"]:
                (tls_dir / item["path"]).write_bytes(secret[item["key"]])
                (tls_dir / item["path"]).chmod(volume["secret"]["defaultMode"])
            volumes.append(f"{tls_dir}:{mounts[volume['name']]}:ro")
    settings = [  # the DaemonSet's own SHELLBOX_* variables (the TLS files)
        f"--env={e['name']}={e['value']}"
        for e in container["env"]
        if e["name"].startswith("SHELLBOX_") and "value" in e
    ]
    assert len(settings) == 2
    for mount in container["volumeMounts"]:
        if mount["name"] == "state":
            volumes.append(f"{state}:{state}")
        elif mount["name"] in host_paths:
            propagation = ":rshared" if mount.get("mountPropagation") == "Bidirectional" else ""
            volumes.append(f"{host_paths[mount['name']]}:{mount['mountPath']}{propagation}")
    port = free_port()
    name = f"shellbox-test-node-{uuid.uuid4().hex[:8]}"
    argv = [
        *PODMAN_RUN, "--detach", "--name", name, "--privileged", "--network", "host",
        *(f"--volume={v}" for v in volumes),
        "--volume", f"{IMAGES.resolve()}:/images:ro",
        "--env=SHELLBOX_RUNTIME__IMAGE_DIR=/images",
        "--env=SHELLBOX_RUNTIME__IMAGE_PROFILE=minimal",
        "--env=SHELLBOX_STORAGE__SIZE_GB=2",
        *settings,
        "--entrypoint", container["command"][0],
        image, *node_args(container, port, state),
    ]  # fmt: skip
    started = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            try:
                # As the kubelet's probe asks (scheme HTTPS, the certificate not checked).
                answer = httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=5, verify=False)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, f"no answer in {STARTUP_S} s: " + logs(name)
                time.sleep(0.5)
        assert answer.status_code == 200, answer.text
        uid, disk = asyncio.run(run_on_node(f"https://127.0.0.1:{port}", key, tls.ca))
        assert uid == ["1000"]
        assert disk[0] == "btrfs"  # the per-container subvolume on the loop device
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "10", name], capture_output=True)
        hostns.detach(str(state / "disks"))
        run_key = hashlib.sha256(str(state).encode()).hexdigest()[:12]
        shutil.rmtree(Path("/run/shellbox") / run_key, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


async def run_on_node(url: str, key: str, ca: Path) -> tuple[list[str], list[str]]:
    """Through the Runtime protocol, as an API replica does: a container's user and disk."""
    runtime = RemoteRuntime(url, key, name="test-node", ca_file=ca)
    cid = new_id("cntr_")
    try:
        await runtime.create(ContainerSpec(id=cid))
        await runtime.start(cid)
        results = await runtime.run(
            cid,
            ExecRequest(
                ["id -u", "df --output=fstype,size -B1G /mnt/data | tail -1"], 60_000, 4096
            ),
        )
        await runtime.destroy(cid)
        return results[0].stdout.split(), results[1].stdout.split()
    finally:
        await runtime.aclose()
