"""Helpers of the egress tests: the local "internet" (an HTTP + HTTPS server in a network
namespace of our own, with a certificate from a test CA), servers, containers, commands."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from waiting import WAIT_S

HERE = Path(__file__).resolve().parent


def _free_block() -> int:
    """A /30 in 10.201.0.0/16 that no interface of this host holds, chosen from this process's
    pid: two test runs on one machine (CI and a developer, or parallel worktrees) must not
    share the upstream's namespace, interface or addresses, or one answers the other's
    requests (and tears its namespace down)."""
    held = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for step in range(16384):
        block = (os.getpid() + step) % 16384
        if f" 10.201.{block // 64}.{(block % 64) * 4 + 1}/" not in held:
            return block
    raise RuntimeError("no free /30 left in 10.201.0.0/16 for the egress tests' upstream")


_BLOCK = _free_block()
UP_NS = f"sbtest-up{_BLOCK}"
UP_HOST_IF = f"sbtu{_BLOCK}"  # at most 9 characters: interface names stop at 15
UP_HOST_IP = f"10.201.{_BLOCK // 64}.{(_BLOCK % 64) * 4 + 1}"  # this host's end of the veth
UP_IP = f"10.201.{_BLOCK // 64}.{(_BLOCK % 64) * 4 + 2}"
NAMES = [
    "api.example.test",
    "other.example.test",
    "sub.api.example.test",
    "blocked.example.test",
    "files.example.test",
]
HOST_NAME = "hostsvc.example.test"  # resolves to an address of this host: must stay unreachable
NOCERT_NAME = "nocert.example.test"  # resolves to the upstream, whose certificate lacks it

# A client that sends CONNECT HOST, then TLS with the SNI it is given and ``GET /echo`` with
# Host: HOST and the API_KEY placeholder; prints the answer's status line
# (``python3 -c "$SNI_PROBE" HOST SNI`` in a container).
SNI_PROBE = r"""
import socket, ssl, sys
host, sni = sys.argv[1], sys.argv[2]
proxy = __import__("os").environ["HTTPS_PROXY"].split("//")[1]
s = socket.create_connection((proxy.split(":")[0], int(proxy.split(":")[1])), timeout=10)
s.sendall(f"CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n".encode())
assert s.recv(4096).startswith(b"HTTP/1.1 200"), "CONNECT refused"
ctx = ssl.create_default_context()
ctx.check_hostname = False
t = ctx.wrap_socket(s, server_hostname=sni)
key = __import__("os").environ["API_KEY"]
head = f"GET /echo HTTP/1.1\r\nHost: {host}\r\nX-Tok: {key}\r\nConnection: close\r\n"
t.sendall(head.encode() + b"\r\n")
data = b""
while chunk := t.recv(65536):
    data += chunk
print(data.decode(errors="replace").split("\r\n", 1)[0])
"""


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and out.returncode != 0:
        raise RuntimeError(f"{argv}: {out.stderr}")
    return out.stdout


@dataclass
class Upstream:
    ip: str
    log: Path
    ca: Path
    hosts_file: Path

    def seen(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def clear(self) -> None:
        self.log.write_text("")
        self.sni_log.write_text("")

    @property
    def sni_log(self) -> Path:
        return self.log.with_name(self.log.name + ".sni")

    def handshakes(self) -> list[str]:
        """The SNI of every TLS handshake since the last ``clear``."""
        return self.sni_log.read_text().split() if self.sni_log.exists() else []


def make_dir(prefix: str) -> Path:
    """A directory the containers' root uid can traverse (not pytest's 0700 tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


def make_certs(d: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
       "-days", "2", "-subj", "/CN=shellbox egress test CA",
       "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    sh("openssl", "req", *ec, "-keyout", str(d / "srv.key"), "-out", str(d / "srv.csr"),
       "-subj", "/CN=api.example.test")  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=" + ",".join(f"DNS:{n}" for n in [*NAMES, HOST_NAME]) + "\n"
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    sh("openssl", "x509", "-req", "-in", str(d / "srv.csr"), "-CA", str(d / "ca.pem"),
       "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "srv.pem"), "-days", "2",
       "-extfile", str(d / "ext.cnf"))  # fmt: skip


def remove_netns(name: str, host_if: str) -> None:
    sh("ip", "-force", "-batch", "-", check=False, input=f"link del {host_if}\nnetns del {name}\n")


@dataclass
class EgressServer:
    server: Any
    key: str

    @property
    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.root_url,
            timeout=120,
            headers={"authorization": f"Bearer {self.key}"},
        )

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.server.base_url, api_key=self.key, max_retries=0)


def start_server(
    server_factory: Callable[..., Any], args: list[str], env: dict[str, str] | None = None
) -> EgressServer:
    srv = server_factory(args=args, env=env, start=False)
    key = srv.create_key("egress")
    srv.env["SHELLBOX_EGRESS_TEST_KEY"] = key
    return EgressServer(srv.start(), key)


def run_key(server: Any) -> str:
    """The name of the server's volatile directory in /run/shellbox (and of its slot claims)."""
    return hashlib.sha256(str(server.state_dir.resolve()).encode()).hexdigest()[:12]


def egress_run_dir(es: EgressServer) -> Path:
    """Where the server and its proxy share policy.json, the audit and the ready file."""
    return Path("/run/shellbox") / run_key(es.server) / "egress"


def wait_for(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def owned_namespaces(server: Any) -> list[str]:
    """The egress namespaces the server's slots hold (their claim files name the server)."""
    owner = run_key(server)
    slots = Path("/run/shellbox/egress-slots")
    out = []
    for f in slots.glob("[0-9]*") if slots.exists() else []:
        with contextlib.suppress(OSError):
            if f.read_text().split("\n", 1)[0] == owner:
                out.append(f"sbe{f.name}")
    return out


def cleanup(es: EgressServer) -> None:
    """Delete what the server made (its release hooks free the namespaces), stop it, and check
    that nothing of the egress plumbing was left behind on the host."""
    with es.http as http:
        for c in http.get("/v1/containers", params={"limit": 100}).json().get("data", []):
            http.delete(f"/v1/containers/{c['id']}")
    deadline = time.monotonic() + WAIT_S
    # what stays until the stop: the warm namespaces (egress.pool_size, 4) and the one of the
    # pooled allowlist container (egress.warm_containers, 1)
    while time.monotonic() < deadline and len(owned_namespaces(es.server)) > 5:
        time.sleep(0.1)  # released namespaces go away in the background
    es.server.stop()
    left = owned_namespaces(es.server)
    for name in left:  # only ever this server's own, by their claim files
        remove_netns(name, name)
        Path(f"/run/shellbox/egress-slots/{name[3:]}").unlink(missing_ok=True)
    assert not left, f"namespaces left behind after a clean stop: {left}"


def run(http: httpx.Client, cid: str, *commands: str, timeout_ms: int = 30_000) -> list[Any]:
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={
            "type": "shell_call",
            "action": {"commands": list(commands), "timeout_ms": timeout_ms},
        },
    )
    assert r.status_code == 200, r.text
    return list(r.json()["output"])


def create(http: httpx.Client, policy: dict[str, Any] | None, name: str = "egress") -> str:
    body: dict[str, Any] = {"name": name}
    if policy is not None:
        body["network_policy"] = policy
    r = http.post("/v1/containers", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])
