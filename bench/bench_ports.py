"""Benchmark: the port route's overhead per HTTP request.

A small HTTP service runs on ``127.0.0.1:8000`` inside a container of a real ``shellbox
serve`` subprocess (network disabled, the default). The same ``GET /`` is timed:

* **direct**: from this process, on a socket made in the container's network namespace
  (``setns``, outside the timing), connect + request + whole answer: the
  baseline, what a client living in the container's namespace would see;
* **key route**: ``/v1/containers/{id}/ports/8000/`` with the key, on a keep-alive connection
  to the server (as an HTTP client keeps one);
* **link route**: ``/v1/port-links/{token}/`` (no key: the signature is checked instead);
* **healthz**: the server's own cheapest route, for scale: the floor of any request to it;
* **container_get**: ``GET /v1/containers/{id}``, the key checked and the container read:
  what any authenticated route of one container costs before it does its own work.

Overhead = median(route) - median(direct); goal <= 1 ms. The service answers with
``Connection: close`` on every request, both ways, so each request also opens a connection to
it in both measurements. The paths take turns request by request, in a shuffled order (a burst
of load elsewhere falls on all of them), and the table also shows the server's CPU per request
(its threads' ``schedstat``), which a busy machine inflates far less than wall times.

Run: ``.venv/bin/python bench/bench_ports.py [--runs N] [--baseline OTHER/.venv/bin/python]``
(``--baseline``: another checkout's server, e.g. main's, measured in the same run). Prints a
table and writes ``bench/results/ports.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import httpx

from bench_http import Server, image_path, shell_call, summary
from shellbox.sandbox import OciRuntime
from shellbox.sandbox.netns_dial import NetnsDialer, open_netns

RESULTS = Path(__file__).resolve().parent / "results" / "ports.json"
GOAL_OVERHEAD_MS = 1.0
PORT = 8000
OK = b"ok\n"
SERVICE = (
    "from http.server import BaseHTTPRequestHandler, HTTPServer\n"
    "class H(BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', '3')\n"
    "        self.end_headers()\n"
    "        self.wfile.write(b'ok\\n')\n"
    "    def log_message(self, *a): pass\n"
    f"HTTPServer(('127.0.0.1', {PORT}), H).serve_forever()\n"
)


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   target: str, headers: list[tuple[str, str]]) -> bytes:  # fmt: skip
    """One HTTP/1.1 request and its whole answer's body."""
    conn = h11.Connection(h11.CLIENT)
    writer.write(conn.send(h11.Request(method="GET", target=target, headers=headers)))
    writer.write(conn.send(h11.EndOfMessage()))
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(65536))
        elif isinstance(event, h11.Response):
            assert event.status_code == 200, event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return body


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have used so far (``/proc/PID/task/*/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


class Route:
    """One of the measured paths: how to make one request on it."""

    def __init__(self, target: str, headers: list[tuple[str, str]], expect: bytes) -> None:
        self.target, self.headers, self.expect = target, headers, expect
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None


async def once_direct(netns: Any, dialer: NetnsDialer) -> float:
    """connect + request + whole answer, on a socket of the container's namespace (made
    outside the timing)."""
    sock = dialer.socket_in(netns)
    t0 = time.perf_counter()
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", PORT))
    reader, writer = await asyncio.open_connection(sock=sock)
    headers = [("host", f"127.0.0.1:{PORT}"), ("connection", "close")]
    body = await exchange(reader, writer, "/", headers)
    elapsed = time.perf_counter() - t0
    assert body == b"ok\n"
    writer.close()
    return elapsed


async def once_routed(server: Server, path: Route) -> float:
    """One request on the path's keep-alive connection to the server."""
    if path.conn is None:
        path.conn = await asyncio.open_connection("127.0.0.1", server.port)
    reader, writer = path.conn
    headers = [("host", f"127.0.0.1:{server.port}"), *path.headers]
    t0 = time.perf_counter()
    body = await exchange(reader, writer, path.target, headers)
    elapsed = time.perf_counter() - t0
    assert path.expect in body, body
    return elapsed


@dataclass
class Target:
    """One server under test: its container running the service, and a link to it."""

    label: str
    server: Server
    cid: str
    link_path: str


def start(label: str, python: str | None) -> Target:
    server = Server({}, python)
    try:
        with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60) as http:
            cid = http.post("/v1/containers", json={"name": "bench"}).json()["id"]
            cmd = f"cat > /tmp/svc.py <<'EOF'\n{SERVICE}EOF\n"
            cmd += "nohup python3 /tmp/svc.py >/dev/null 2>&1 &"
            http.post(f"/v1/containers/{cid}/calls", json=shell_call(cmd))
            for _ in range(200):
                if http.get(f"/v1/containers/{cid}/ports/{PORT}/").status_code == 200:
                    break
                time.sleep(0.05)
            link = http.post(f"/v1/containers/{cid}/ports/{PORT}/links", json={}).json()["url"]
    except BaseException:
        server.stop()
        raise
    return Target(label, server, cid, "/" + link.split("/", 3)[3])


async def measure(
    targets: list[Target], runs: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Wall times per path, and the server's CPU per request (ms) per path. The paths (and
    the servers) take turns request by request, so a burst of load elsewhere on the machine
    falls on all of them."""
    dialer = NetnsDialer()
    held = []
    plan: list[tuple[str, Target, Any]] = []  # (name, target, Route or the netns)
    for t in targets:
        runtime = OciRuntime(t.server.dir, image_path())
        pid = await runtime.agent_pid(t.cid)
        assert pid is not None
        netns = open_netns(pid, t.cid)
        assert netns is not None
        held.append(netns)
        key = [("authorization", f"Bearer {t.server.key}")]
        plan += [
            (f"direct{t.label}", t, netns),
            (f"key_route{t.label}", t, Route(f"/v1/containers/{t.cid}/ports/{PORT}/", key, OK)),
            (f"link_route{t.label}", t, Route(t.link_path, [], OK)),
            (f"healthz{t.label}", t, Route("/healthz", [], b'"ok"')),
            (f"container_get{t.label}", t, Route(f"/v1/containers/{t.cid}", key, t.cid.encode())),
        ]
    samples: dict[str, list[float]] = {name: [] for name, _, _ in plan}
    cpu: dict[str, float] = {name: 0 for name, _, how in plan if isinstance(how, Route)}
    warm_up = max(runs // 4, 10)
    try:
        shuffle = random.Random(42).shuffle
        for round_ in range(warm_up + runs):
            # In a fixed order the path after the direct one paid for the server waking up
            # (measured: whichever route came first was 0.5 ms slower): shuffled per round.
            shuffle(plan)
            for name, t, how in plan:
                if not isinstance(how, Route):
                    elapsed = await once_direct(how, dialer)
                else:
                    used = cpu_ns(t.server.proc.pid)
                    elapsed = await once_routed(t.server, how)
                    if round_ >= warm_up:
                        cpu[name] += cpu_ns(t.server.proc.pid) - used
                if round_ >= warm_up:
                    samples[name].append(elapsed)
    finally:
        for _, _, how in plan:
            if isinstance(how, Route) and how.conn is not None:
                how.conn[1].close()
        dialer.close()
        for netns in held:
            netns.close()
    return samples, {name: ns / runs / 1e6 for name, ns in cpu.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="another checkout's venv python (e.g. main's): its server is measured in the "
        "same run, request by request with this one's, and shown as '(base)'",
    )
    args = parser.parse_args()
    targets: list[Target] = []
    try:
        targets.append(start("", None))
        if args.baseline:
            targets.append(start(" (base)", args.baseline))
        samples, cpu = asyncio.run(measure(targets, args.runs))
    finally:
        for t in targets:
            t.server.stop()
    results = {name: summary(s) for name, s in samples.items()}
    for name, ms in cpu.items():
        results[name]["server_cpu_ms"] = round(ms, 3)
    for t in targets:
        base = statistics.median(samples[f"direct{t.label}"]) * 1000
        for route in ("key_route", "link_route"):
            name = route + t.label
            med = statistics.median(samples[name]) * 1000
            results[name]["overhead_ms"] = round(med - base, 3)
            results[name]["ratio"] = round(med / base, 2)
    print(
        f"{'path':<20} {'p50 ms':>8} {'p99 ms':>8} {'overhead ms':>12} {'ratio':>6} "
        f"{'server cpu ms':>14}"
    )
    for name, row in results.items():
        print(
            f"{name:<20} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
            f"{row.get('overhead_ms', 0):>12.3f} {row.get('ratio', 1):>6.2f} "
            f"{row.get('server_cpu_ms', 0):>14.3f}"
        )
    worst = max(results["key_route"]["overhead_ms"], results["link_route"]["overhead_ms"])
    verdict = "met" if worst <= GOAL_OVERHEAD_MS else "NOT met"
    print(f"goal: overhead <= {GOAL_OVERHEAD_MS} ms: {verdict}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "runs": args.runs,
                "baseline": args.baseline,
                "goal_overhead_ms": GOAL_OVERHEAD_MS,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
