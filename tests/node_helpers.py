"""``shellbox node`` in a subprocess, on its own state directory, loopback port and cluster key
(the runtime contract suite and the API tests reach it through ``RemoteRuntime``)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_state_dir(prefix: str) -> Path:
    """A state directory the containers' root uid can traverse (not pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


def write_key_file(directory: Path, key: str | None = None, mode: int = 0o600) -> Path:
    path = directory / "cluster.key"
    path.write_text((key or secrets.token_urlsafe(32)) + "\n")
    path.chmod(mode)
    return path


@dataclass
class NodeProcess:
    state_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    name: str = "test-node"
    key_file: Path | None = None
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    ca_file: Path | None = None  # serving https (its certificate and key in ``env``): its CA

    def __post_init__(self) -> None:
        if self.key_file is None:  # removed with the state directory
            self.key_file = write_key_file(self.state_dir)

    @property
    def url(self) -> str:
        return f"{'https' if self.ca_file else 'http'}://127.0.0.1:{self.port}"

    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else True

    @property
    def key(self) -> str:
        assert self.key_file is not None
        return self.key_file.read_text().strip()

    @property
    def log_path(self) -> Path:
        return self.state_dir / f"node-{self.port}.log"

    def log(self) -> str:
        return self.log_path.read_text()[-5000:] if self.log_path.exists() else ""

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "shellbox.cli", "node",
            "--state-dir", str(self.state_dir),
            "--listen", f"127.0.0.1:{self.port}",
            "--cluster-key-file", str(self.key_file),
            "--name", self.name,
            *self.args,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SHELLBOX_RUNTIME__IMAGE_DIR"] = str(IMAGE_DIR)
        env.update(self.env)
        return env

    def start(self, timeout_s: float = 60) -> NodeProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited: {self.log()}")
            try:
                health = httpx.get(f"{self.url}/healthz", timeout=1, verify=self.verify())
                if health.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"node did not start: {self.log()}")

    def destroy_all(self) -> None:
        """Destroy every container the node holds, through its own API."""
        auth = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(
            base_url=self.url, headers=auth, timeout=120, verify=self.verify()
        ) as http:
            listed = http.post("/v1/runtime/list", json={}).json()["result"]
            for info in listed:
                http.post("/v1/runtime/destroy", json={"container_id": info["id"]})

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
