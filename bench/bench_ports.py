"""Benchmark: the port route's overhead per HTTP request.

A small HTTP service runs on ``127.0.0.1:8000`` inside a container of a real ``shellbox
serve`` subprocess (network disabled, the default). The same ``GET /`` is timed:

* **direct**: from this process, on a socket made in the container's network namespace
  (``setns`` on a helper thread, outside the timing), connect + request + whole answer: the
  baseline, what a client living in the container's namespace would see;
* **key route**: ``/v1/containers/{id}/ports/8000/`` with the key, on a keep-alive connection
  to the server (as an HTTP client keeps one);
* **link route**: ``/v1/port-links/{token}/`` (no key: the signature is checked instead);
* **healthz**: the server's own cheapest route, for scale: the floor of any request to it;
* **container_get**: ``GET /v1/containers/{id}``, the key checked and the container read:
  what any authenticated route of one container costs before it does its own work.

Overhead = median(route) - median(direct); goal <= 1 ms. The service answers with
``Connection: close`` on every request, both ways, so each request also opens a connection to
it in both measurements.

Run: ``.venv/bin/python bench/bench_ports.py [--runs N]``. Prints a table and writes
``bench/results/ports.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import statistics
import time
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


async def direct(netns: Any, dialer: NetnsDialer, runs: int) -> list[float]:
    samples = []
    loop = asyncio.get_running_loop()
    for _ in range(runs):
        sock = dialer.socket_in(netns)
        t0 = time.perf_counter()
        await loop.sock_connect(sock, ("127.0.0.1", PORT))
        reader, writer = await asyncio.open_connection(sock=sock)
        headers = [("host", f"127.0.0.1:{PORT}"), ("connection", "close")]
        body = await exchange(reader, writer, "/", headers)
        samples.append(time.perf_counter() - t0)
        assert body == b"ok\n"
        writer.close()
    return samples


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have used so far (``/proc/PID/task/*/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


async def routed(server: Server, target: str, headers: list[tuple[str, str]],
                 runs: int, cpu: dict[str, float], name: str,
                 expect: bytes = b"ok\n") -> list[float]:  # fmt: skip
    """The requests' wall times; ``cpu[name]``: the server's CPU per request (ms), which
    a busy machine inflates far less than the wall times."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    headers = [("host", f"127.0.0.1:{server.port}"), *headers]
    samples = []
    used = cpu_ns(server.proc.pid)
    for _ in range(runs):
        t0 = time.perf_counter()
        body = await exchange(reader, writer, target, headers)
        samples.append(time.perf_counter() - t0)
        assert expect in body, body
    cpu[name] = (cpu_ns(server.proc.pid) - used) / runs / 1e6
    writer.close()
    return samples


async def measure(
    server: Server, cid: str, link_path: str, runs: int, cpu: dict[str, float]
) -> dict[str, Any]:
    runtime = OciRuntime(server.dir, image_path())
    pid = await runtime.agent_pid(cid)
    assert pid is not None
    netns = open_netns(pid, cid)
    assert netns is not None
    dialer = NetnsDialer()
    key = [("authorization", f"Bearer {server.key}")]
    key_target = f"/v1/containers/{cid}/ports/{PORT}/"
    out: dict[str, Any] = {}
    try:
        for _ in range(2):  # warm-up, then the measured rounds, interleaved
            rounds = max(runs // 4, 10) if not out else runs
            out = {
                "direct": await direct(netns, dialer, rounds),
                "key_route": await routed(server, key_target, key, rounds, cpu, "key_route"),
                "link_route": await routed(server, link_path, [], rounds, cpu, "link_route"),
                "healthz": await routed(server, "/healthz", [], rounds, cpu, "healthz", b'"ok"'),
                "container_get": await routed(
                    server,
                    f"/v1/containers/{cid}",
                    key,
                    rounds,
                    cpu,
                    "container_get",
                    cid.encode(),
                ),
            }
    finally:
        dialer.close()
        netns.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    server = Server({})
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
            link_path = "/" + link.split("/", 3)[3]
            cpu: dict[str, float] = {}
            samples = asyncio.run(measure(server, cid, link_path, args.runs, cpu))
    finally:
        server.stop()
    results = {name: summary(s) for name, s in samples.items()}
    for name, ms in cpu.items():
        results[name]["server_cpu_ms"] = round(ms, 3)
    base = statistics.median(samples["direct"]) * 1000
    for name in ("key_route", "link_route"):
        med = statistics.median(samples[name]) * 1000
        results[name]["overhead_ms"] = round(med - base, 3)
        results[name]["ratio"] = round(med / base, 2)
    print(
        f"{'path':<13} {'p50 ms':>8} {'p99 ms':>8} {'overhead ms':>12} {'ratio':>6} "
        f"{'server cpu ms':>14}"
    )
    for name, row in results.items():
        print(
            f"{name:<13} {row['p50_ms']:>8.3f} {row['p99_ms']:>8.3f} "
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
                "goal_overhead_ms": GOAL_OVERHEAD_MS,
                "results": results,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
