"""``shellbox node`` in a subprocess, on its own state directory, loopback port and cluster key
(the runtime contract suite and the API tests reach it through ``RemoteRuntime``)."""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from process_helpers import START_TIMEOUT_S, ChildProcess
from process_helpers import free_port as free_port
from process_helpers import make_state_dir as make_state_dir

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"


def write_key_file(directory: Path, key: str | None = None, mode: int = 0o600) -> Path:
    path = directory / "cluster.key"
    path.write_text((key or secrets.token_urlsafe(32)) + "\n")
    path.chmod(mode)
    return path


@dataclass
class NodeProcess(ChildProcess):
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

    def start(self, timeout_s: float = START_TIMEOUT_S) -> NodeProcess:
        self.launch(
            self.command(),
            self.environment(),
            self.log_path,
            f"{self.url}/healthz",
            timeout_s,
            verify=self.verify(),
        )
        return self

    def destroy_all(self) -> None:
        """Destroy every container the node holds, through its own API."""
        auth = {"authorization": f"Bearer {self.key}"}
        with httpx.Client(
            base_url=self.url, headers=auth, timeout=120, verify=self.verify()
        ) as http:
            listed = http.post("/v1/runtime/list", json={}).json()["result"]
            for info in listed:
                http.post("/v1/runtime/destroy", json={"container_id": info["id"]})
