"""Benchmark: the egress proxy's cost, against going directly to the same local upstream.

Same run, same upstream (the egress tests' HTTP/HTTPS server, in a network namespace of its
own, with a test CA), from a real ``shellbox serve`` subprocess:

* 1 KB HTTPS GET: p50 latency from inside an allowlist container (through the proxy: CONNECT,
  TLS interception, re-encryption) versus from the host straight to the upstream. Measured two
  ways, with the same Python client on both sides: on a kept-alive connection (one request on
  an open connection: the per-request cost) and with a new connection per request (TCP + TLS
  handshakes: through the proxy there are two of each).
* 100 MB HTTPS download with curl: throughput through the proxy versus direct, with the
  default ``egress.intercept = all`` and with ``secrets`` (hosts without a secret tunnelled).
* Creating a container (POST /v1/containers, p50) with an allowlist versus without: with the
  server's warm pools of started containers (one for each kind, ``lifecycle.warm_pool_size``
  and ``egress.warm_containers``), and without them (what the egress plumbing itself adds).

Targets: added latency per request <= 2 ms p50; download >= 70 % of direct; create with an
allowlist <= 15 ms slower than without.

Run: ``.venv/bin/python bench/bench_egress.py [--requests N] [--creates N]``. Prints a table
and writes ``bench/results/egress.json``. Needs root, the sandbox image and ``.venv-egress``
(./scripts/setup.sh), like the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = REPO / "tests" / "egress" / "upstream.py"
RESULTS = Path(__file__).resolve().parent / "results" / "egress.json"
NS, HOST_IF, HOST_IP, UP_IP = "sbbench-up", "sbbu1", "10.202.0.1", "10.202.0.2"
NAME = "api.example.test"
TARGETS = {"added_latency_p50_ms": 2.0, "throughput_ratio": 0.7, "create_added_p50_ms": 15.0}

# The same client runs in the container (through the proxy variables) and on the host
# (direct): persistent or fresh HTTPS connections, GET a path, print per-request times in ms.
CLIENT = r"""
import http.client, json, os, socket, ssl, sys, time
mode, n, fresh, path = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
cafile = sys.argv[5] if len(sys.argv) > 5 else None
ctx = ssl.create_default_context(cafile=cafile)
class Direct(http.client.HTTPSConnection):
    def connect(self):
        raw = socket.create_connection((os.environ["UPSTREAM_IP"], 443))
        self.sock = ctx.wrap_socket(raw, server_hostname=self.host)
def connection():
    if mode == "direct":
        return Direct("NAME", 443, context=ctx)
    proxy = os.environ["HTTPS_PROXY"].split("//")[1]
    host, port = proxy.split(":")
    c = http.client.HTTPSConnection(host, int(port), context=ctx)
    c.set_tunnel("NAME", 443)
    return c
def get(c):
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    assert r.status == 200 and len(body) > 0, r.status
conn = connection()
get(conn)  # warm: handshakes, certificate generation in the proxy
times = []
for _ in range(n):
    if fresh:
        conn.close()
        conn = connection()
    t = time.perf_counter()
    get(conn)
    times.append((time.perf_counter() - t) * 1000)
print(json.dumps(times))
""".replace("NAME", NAME)


def sh(*argv: str, check: bool = True, input: str | None = None) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, input=input)
    if check and out.returncode != 0:
        raise RuntimeError(f"{argv}: {out.stderr}")
    return out.stdout


def make_certs(d: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
       "-days", "2", "-subj", "/CN=shellbox bench CA",
       "-addext", "basicConstraints=critical,CA:TRUE",
       "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    sh("openssl", "req", *ec, "-keyout", str(d / "srv.key"), "-out", str(d / "srv.csr"),
       "-subj", f"/CN={NAME}")  # fmt: skip
    (d / "ext.cnf").write_text(
        f"subjectAltName=DNS:{NAME}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    sh("openssl", "x509", "-req", "-in", str(d / "srv.csr"), "-CA", str(d / "ca.pem"),
       "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "srv.pem"), "-days", "2",
       "-extfile", str(d / "ext.cnf"))  # fmt: skip


def remove_netns() -> None:
    sh("ip", "-force", "-batch", "-", check=False, input=f"link del {HOST_IF}\nnetns del {NS}\n")


def start_upstream(d: Path) -> subprocess.Popen[str]:
    remove_netns()
    sh("ip", "-batch", "-", input=(
        f"netns add {NS}\nlink add {HOST_IF} type veth peer name eth0 netns {NS}\n"
        f"addr add {HOST_IP}/30 dev {HOST_IF}\nlink set {HOST_IF} up\n"
    ))  # fmt: skip
    sh("ip", "-n", NS, "-batch", "-",
       input=f"addr add {UP_IP}/30 dev eth0\nlink set lo up\nlink set eth0 up\n")  # fmt: skip
    proc = subprocess.Popen(
        ["ip", "netns", "exec", NS, sys.executable, str(UPSTREAM), "--cert", str(d / "srv.pem"),
         "--key", str(d / "srv.key"), "--log", "/dev/null"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


class Server:
    def __init__(self, state: Path, d: Path, **settings: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, SHELLBOX_RUNTIME__IMAGE_DIR=str(REPO / ".state" / "images"))
        env.update(settings)
        cli = [sys.executable, "-m", "shellbox.cli"]
        self.key = sh(*cli, "keys", "create", "--project", "bench", "--state-dir", str(state))
        self.key = self.key.strip()
        (d / "hosts").write_text(f"{UP_IP} {NAME}\n")
        self.log = open(state / "server.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*cli, "serve", "--state-dir", str(state), "--port", str(self.port),
             "--egress-upstream-ca", str(d / "ca.pem"), "--egress-hosts-file", str(d / "hosts")],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"authorization": f"Bearer {self.key}"},
            timeout=600,
        )
        for _ in range(600):
            try:
                if self.http.get("/healthz").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def create(self, policy: dict[str, Any] | None) -> tuple[str, float]:
        body: dict[str, Any] = {"name": "bench"}
        if policy:
            body["network_policy"] = policy
        t = time.perf_counter()
        r = self.http.post("/v1/containers", json=body)
        ms = (time.perf_counter() - t) * 1000
        r.raise_for_status()
        return str(r.json()["id"]), ms

    def run(self, cid: str, command: str) -> str:
        r = self.http.post(
            f"/v1/containers/{cid}/calls",
            json={"type": "shell_call", "action": {"commands": [command], "timeout_ms": 300_000,
                                                   "max_output_length": 65_536}},
        )  # fmt: skip
        r.raise_for_status()
        out = r.json()["output"][0]
        if out["outcome"].get("exit_code"):
            raise RuntimeError(out["stderr"])
        return str(out["stdout"])

    def delete(self, cid: str) -> None:
        self.http.delete(f"/v1/containers/{cid}")

    def stop(self) -> None:
        for c in self.http.get("/v1/containers", params={"limit": 100}).json()["data"]:
            self.delete(c["id"])
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 3)


def latency(server: Server, cid: str, d: Path, n: int, fresh: bool) -> dict[str, float]:
    args = f"{n} {'1' if fresh else '0'} /bytes/1024"
    via = json.loads(server.run(cid, f"python3 - proxy {args} <<'PY'\n{CLIENT}\nPY"))
    direct = json.loads(
        subprocess.run(
            [sys.executable, "-", "direct", *args.split(), str(d / "ca.pem")],
            input=CLIENT, capture_output=True, text=True, check=True,
            env=dict(os.environ, UPSTREAM_IP=UP_IP),
        ).stdout
    )  # fmt: skip
    return {
        "proxy_p50_ms": p50(via),
        "direct_p50_ms": p50(direct),
        "added_p50_ms": round(p50(via) - p50(direct), 3),
    }


def download(server: Server, cid: str, d: Path, runs: int) -> dict[str, float]:
    url = f"https://{NAME}/bytes/{100 << 20}"
    curl = "curl -sS -o /dev/null -w '%{speed_download}'"
    via, direct = [], []
    for _ in range(runs):
        via.append(float(server.run(cid, f"{curl} {url}")) / 1e6)
        direct.append(float(sh(*curl.replace("'", "").split(), "--cacert", str(d / "ca.pem"),
                               "--resolve", f"{NAME}:443:{UP_IP}", url)) / 1e6)  # fmt: skip
    return {
        "proxy_MBps": round(statistics.median(via), 1),
        "direct_MBps": round(statistics.median(direct), 1),
        "ratio": round(statistics.median(via) / statistics.median(direct), 3),
    }


def creates(server: Server, n: int, pause: float) -> dict[str, float]:
    policy = {"type": "allowlist", "allowed_domains": [NAME]}
    plain, allow = [], []
    for _ in range(n):
        for kind, out in ((None, plain), (policy, allow)):
            cid, ms = server.create(kind)
            out.append(ms)
            server.delete(cid)
            time.sleep(pause)  # the pool refills in the background: measure the steady state
    return {
        "without_p50_ms": p50(plain),
        "with_allowlist_p50_ms": p50(allow),
        "added_p50_ms": round(p50(allow) - p50(plain), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="GETs per latency sample set")
    parser.add_argument("--fresh", type=int, default=60, help="GETs on new connections")
    parser.add_argument("--downloads", type=int, default=3, help="100 MB downloads per side")
    parser.add_argument("--creates", type=int, default=30, help="containers per kind")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between creates")
    args = parser.parse_args()

    d = Path(tempfile.mkdtemp(prefix="shellbox-bench-egress-", dir="/var/tmp"))
    d.chmod(0o711)
    make_certs(d)
    upstream = start_upstream(d)
    allow = {"type": "allowlist", "allowed_domains": [NAME]}
    result: dict[str, Any] = {}
    try:
        # the defaults: every HTTPS request decrypted and audited; the server's warm pool of
        # started containers serves creations without a policy
        server = Server(d / "state", d)
        try:
            cid, _ = server.create(allow)
            result["https_1kb_keepalive"] = latency(server, cid, d, args.requests, fresh=False)
            result["https_1kb_new_connection"] = latency(server, cid, d, args.fresh, fresh=True)
            result["download_100mb"] = download(server, cid, d, args.downloads)
            server.delete(cid)
            time.sleep(1)
            result["container_create"] = creates(server, args.creates, args.pause)
        finally:
            server.stop()
        # egress.intercept = secrets (hosts without a secret are tunnelled), and no warm pools
        # of started containers: what the namespace plumbing alone adds to a creation
        server = Server(
            d / "state2", d,
            SHELLBOX_EGRESS__INTERCEPT="secrets", SHELLBOX_LIFECYCLE__WARM_POOL_SIZE="0",
            SHELLBOX_EGRESS__WARM_CONTAINERS="0",
        )  # fmt: skip
        try:
            cid, _ = server.create(allow)
            result["download_100mb_intercept_secrets"] = download(server, cid, d, args.downloads)
            server.delete(cid)
            time.sleep(1)
            result["container_create_no_warm_pool"] = creates(server, args.creates, args.pause)
        finally:
            server.stop()
    finally:
        upstream.kill()
        upstream.wait()
        remove_netns()
        shutil.rmtree(d, ignore_errors=True)
    result["targets"] = TARGETS
    result["meets_targets"] = {
        "added_latency_keepalive": result["https_1kb_keepalive"]["added_p50_ms"]
        <= TARGETS["added_latency_p50_ms"],
        "added_latency_new_connection": result["https_1kb_new_connection"]["added_p50_ms"]
        <= TARGETS["added_latency_p50_ms"],
        "throughput": result["download_100mb"]["ratio"] >= TARGETS["throughput_ratio"],
        "throughput_intercept_secrets": result["download_100mb_intercept_secrets"]["ratio"]
        >= TARGETS["throughput_ratio"],
        "create": result["container_create"]["added_p50_ms"] <= TARGETS["create_added_p50_ms"],
        "create_no_warm_pool": result["container_create_no_warm_pool"]["added_p50_ms"]
        <= TARGETS["create_added_p50_ms"],
    }
    result.update(
        cpus=os.cpu_count(), python=platform.python_version(), platform=platform.platform()
    )
    for key, value in result.items():
        print(f"{key:28} {value}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
