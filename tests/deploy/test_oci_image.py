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
image's own crun, btrfs and agent run a real sandbox command with a disk quota. `shellbox
node` is not on main yet (the seam branch adds it): until then `shellbox run` stands for it.

The image is built (or found cached) by scripts/image.sh, which scripts/test.sh runs first.
"""

from __future__ import annotations

import hashlib
import json
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
from shellbox.sandbox import hostns

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


def test_node_role_from_the_image_runs_a_sandbox(image: str) -> None:
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
    volumes = []
    for mount in container["volumeMounts"]:
        if mount["name"] == "state":
            volumes.append(f"{state}:{state}")
        elif mount["name"] in host_paths:
            propagation = ":rshared" if mount.get("mountPropagation") == "Bidirectional" else ""
            volumes.append(f"{host_paths[mount['name']]}:{mount['mountPath']}{propagation}")
    assert len(volumes) == len(host_paths)
    argv = [
        *PODMAN_RUN, "--rm", "--privileged", "--network", "none",
        *(f"--volume={v}" for v in volumes),
        "--volume", f"{IMAGES.resolve()}:/images:ro",
        "--env=SHELLBOX_RUNTIME__IMAGE_DIR=/images",
        "--env=SHELLBOX_RUNTIME__IMAGE_PROFILE=minimal",
        "--env=SHELLBOX_STORAGE__SIZE_GB=2",
        "--entrypoint", container["command"][0],
        image, "run", "--state-dir", str(state), "--",
        "id -u", "df --output=fstype,size -B1G /mnt/data | tail -1",
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        item = json.loads(done.stdout)
        assert item["type"] == "shell_call_output"
        uid, disk = (o["stdout"].split() for o in item["output"])
        assert uid == ["1000"]
        assert disk[0] == "btrfs"  # the per-container subvolume on the loop device
    finally:
        hostns.detach(str(state / "disks"))
        key = hashlib.sha256(str(state).encode()).hexdigest()[:12]
        shutil.rmtree(Path("/run/shellbox") / key, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)
