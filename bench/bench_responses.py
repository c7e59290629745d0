"""Benchmark: the tool loop's own overhead per tool round (``POST /v1/responses``).

A real ``shellbox serve`` subprocess drives a scripted upstream model (a loopback HTTP server
in this process, Chat Completions dialect) that asks for ``rounds`` shell calls of ``true``
and then answers with text. Each non-streamed response carries a ``Server-Timing`` header
with the time spent waiting for the upstream (``upstream``), running commands (``exec``: first
command start to last command end) and in all (``total``); what is left is shellbox's own
work: parsing, building the upstream request, reading its answer, the call's bookkeeping
(waking and touching the container, indexing /mnt/data) and the events.

Per-round overhead = (overhead of a response with ``rounds`` tool rounds - median overhead of
a response with none) / ``rounds``, so the per-request work (parsing the request, storing the
response) is not counted. Measured in the same run against the same upstream; the upstream's
own round trip and the exec time are printed alongside. Target: p50 <= 3 ms per round.

Run: ``.venv/bin/python bench/bench_responses.py [--runs N] [--rounds K]``. Prints a table
and writes ``bench/results/responses.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench_server import stop_server, wait_healthy

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = Path(__file__).resolve().parent / "results" / "responses.json"
TARGET_MS = 3.0


# -- the scripted upstream ----------------------------------------------------------------------


def upstream_answer(body: dict[str, Any]) -> dict[str, Any]:
    """``rounds=K`` in the first user message: K shell calls, one per turn, then text."""
    messages = body["messages"]
    user = next(m["content"] for m in messages if m["role"] == "user")
    rounds = int(user.split("rounds=")[1])
    done = sum(1 for m in messages if m["role"] == "tool")
    if done < rounds:
        call = {
            "id": f"call_{done}",
            "type": "function",
            "function": {"name": "shell", "arguments": '{"commands": ["true"]}'},
        }
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": f"done after {done} rounds"}, "stop"
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class Upstream:
    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                data = json.dumps(upstream_answer(body)).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- the server ---------------------------------------------------------------------------------


class Server:
    def __init__(self, upstream_url: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shellbox-bench-resp-", dir="/var/tmp"))
        self.dir.chmod(0o711)  # the containers' root uid must traverse it
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "SHELLBOX_RUNTIME__IMAGE_DIR": str(IMAGE_DIR)}
        cli = [sys.executable, "-m", "shellbox.cli"]
        self.key = subprocess.run(
            [*cli, "keys", "create", "--project", "bench", "--state-dir", str(self.dir)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
        ).stdout.strip()
        self.log = open(self.dir / "server.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                *cli,
                "serve",
                "--state-dir",
                str(self.dir),
                "--port",
                str(self.port),
                "--upstream-base-url",
                upstream_url,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_healthy(self.url, self.proc, self.dir / "server.log")

    def stop(self) -> None:
        from shellbox.sandbox import OciRuntime
        from shellbox.sandbox.image import image_for

        stop_server(self.proc, self.log)
        runtime = OciRuntime(self.dir, image_for(IMAGE_DIR, "minimal").path)
        for info in asyncio.run(runtime.list()):
            asyncio.run(runtime.destroy(info.id))
        shutil.rmtree(self.dir, ignore_errors=True)


# -- measuring ----------------------------------------------------------------------------------


def timings(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur)
    return out


def run(http: httpx.Client, cid: str, rounds: int) -> tuple[dict[str, float], float]:
    tools = [{"type": "shell", "environment": {"type": "container_reference", "container_id": cid}}]
    t0 = time.perf_counter()
    r = http.post(
        "/v1/responses",
        json={"model": "bench-model", "input": f"rounds={rounds}", "tools": tools},
    )
    wall_ms = (time.perf_counter() - t0) * 1000
    body = r.json()
    assert r.status_code == 200, r.text
    assert body["output"][-1]["content"][0]["text"] == f"done after {rounds} rounds", body
    assert len(body["output"]) == 2 * rounds + 1
    return timings(r.headers["server-timing"]), wall_ms


def upstream_round_trip(url: str, runs: int) -> list[float]:
    """The scripted upstream's own round trip, seen from a keep-alive client."""
    body = {"model": "m", "messages": [{"role": "user", "content": "rounds=1"}]}
    samples = []
    with httpx.Client(timeout=30) as client:
        for _ in range(runs):
            t0 = time.perf_counter()
            client.post(f"{url}/chat/completions", json=body).raise_for_status()
            samples.append((time.perf_counter() - t0) * 1000)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="responses per row")
    parser.add_argument("--rounds", type=int, default=5, help="tool rounds per response")
    args = parser.parse_args(argv)
    runs, rounds = args.runs, args.rounds

    upstream = Upstream()
    server = Server(upstream.url)
    try:
        headers = {"authorization": f"Bearer {server.key}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
            cid = http.post("/v1/containers", json={"name": "bench"}).json()["id"]
            for _ in range(3):  # warm up: connections, the container's agent, caches
                run(http, cid, rounds)
                run(http, cid, 0)
            plain: list[float] = []
            looped: list[dict[str, float]] = []
            walls: list[float] = []
            for _ in range(runs):  # interleaved, so drift hits both alike
                t0, _wall0 = run(http, cid, 0)
                plain.append(t0["total"] - t0["upstream"] - t0["exec"])
                tk, wall = run(http, cid, rounds)
                looped.append(tk)
                walls.append(wall)
        upstream_ms = upstream_round_trip(upstream.url, runs * 4)
    finally:
        server.stop()
        upstream.stop()

    base = statistics.median(plain)
    per_round = [((t["total"] - t["upstream"] - t["exec"]) - base) / rounds for t in looped]
    p50 = statistics.median(per_round)
    rows = {
        "overhead per tool round (p50)": p50,
        "overhead per tool round (p90)": sorted(per_round)[int(0.9 * (len(per_round) - 1))],
        "overhead of a response with no tools (p50)": base,
        f"response with {rounds} rounds, server total (p50)": statistics.median(
            t["total"] for t in looped
        ),
        f"response with {rounds} rounds, client wall (p50)": statistics.median(walls),
        "upstream wait per turn (p50)": statistics.median(
            t["upstream"] / (rounds + 1) for t in looped
        ),
        "upstream round trip, direct client (p50)": statistics.median(upstream_ms),
        "command exec per round (p50)": statistics.median(t["exec"] / rounds for t in looped),
    }
    print(f"{runs} responses of {rounds} rounds each (and {runs} without tools), interleaved")
    print(f"{'measure':<48} {'ms':>8}")
    for name, ms in rows.items():
        print(f"{name:<48} {ms:>8.3f}")
    verdict = "OK" if p50 <= TARGET_MS else "OVER TARGET"
    print(f"overhead per round p50 {p50:.3f} ms vs target {TARGET_MS:.1f} ms: {verdict}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "runs": runs,
        "rounds": rounds,
        "ms": {name: round(ms, 3) for name, ms in rows.items()},
        "overhead_per_round_p50_ms": round(p50, 3),
        "target_ms": TARGET_MS,
        "meets_target": p50 <= TARGET_MS,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
