"""Benchmark: server and agent memory under concurrent calls of 100 commands of 1 MiB.

Through a real ``shellbox serve`` subprocess (default settings, so the body budget is 256 MiB),
N calls of 100 x 1 MiB commands are sent at once to one ``1g`` container, for N = 1, 4, 8
(a fresh server each, so each peak is its own). Reported: the server's peak resident memory
(``VmHWM``) above what it held before the calls, what it still holds above that afterwards,
the agent's peak, how many calls answered 200, and the wall time.

Goal: 8 calls at once all succeed or answer a clear 429 (one that waited longer than
``limits.body_budget_wait_s`` for room in the body budget), with the server's peak growth under
700 MB (about twice the body budget) and the agent's peak under 40 MB (its reserve is 48 MiB).
Before this was measured (issue "Reliability under load"): 440 MB, 1.4 GB and 2.7 GB of server
RSS for 1, 4 and 8 calls, kept afterwards, and 8 calls answered 500 (the agent was OOM-killed).

Run: ``.venv/bin/python bench/bench_call_memory.py [--calls 1,4,8]``. Prints a table and
writes ``bench/results/call_memory.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench_http import Server, shell_call

RESULTS = Path(__file__).resolve().parent / "results" / "call_memory.json"
MIB = 1 << 20
GOAL_SERVER_GROWTH_MB = 700
GOAL_AGENT_MB = 40


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def agent_pid(cid: str) -> int:
    """The container's PID 1, from its memory cgroup (cgroup v1 layout) or v2's agent leaf."""
    for procs in (
        f"/sys/fs/cgroup/memory/shellbox/{cid}/cgroup.procs",
        f"/sys/fs/cgroup/shellbox/{cid}/agent/cgroup.procs",
    ):
        if not os.path.exists(procs):
            continue
        for pid in Path(procs).read_text().split():
            status = Path(f"/proc/{pid}/status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            if nspid.split()[-1] == "1":
                return int(pid)
    raise LookupError(cid)


def body() -> bytes:
    """100 commands of exactly 1 MiB each; each prints its index and exits before bash
    parses the comment that fills it."""
    commands = []
    for i in range(100):
        head = f"echo {i}; exit\\n#".encode()
        commands.append(b'"' + head + b"x" * (MIB - len(head) + 1) + b'"')
    return b'{"type":"shell_call","action":{"commands":[' + b",".join(commands) + b"]}}"


def measure(calls: int, payload: bytes) -> dict[str, Any]:
    server = Server({})
    try:
        headers = server.headers()
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
            cid = http.post("/v1/containers", json={"name": "m", "memory_limit": "1g"}).json()["id"]
            http.post(f"/v1/containers/{cid}/calls", json=shell_call("true"))
        before = status_kb(server.proc.pid, "VmRSS")
        gate = threading.Barrier(calls)

        def post(_: int) -> int:
            with httpx.Client(base_url=server.url, headers=headers, timeout=900) as c:
                gate.wait()
                r = c.post(
                    f"/v1/containers/{cid}/calls",
                    content=payload,
                    headers={"content-type": "application/json"},
                )
                return r.status_code

        t = time.monotonic()
        with ThreadPoolExecutor(calls) as pool:
            codes = list(pool.map(post, range(calls)))
        elapsed = time.monotonic() - t
        peak = status_kb(server.proc.pid, "VmHWM")
        after = status_kb(server.proc.pid, "VmRSS")
        try:
            agent_mb: float | None = status_kb(agent_pid(cid), "VmHWM") / 1024
        except (LookupError, OSError):
            agent_mb = None  # the agent died
        return {
            "calls": calls,
            "ok": codes.count(200),
            "statuses": sorted(set(codes)),
            "server_peak_growth_mb": round((peak - before) / 1024),
            "server_kept_mb": round((after - before) / 1024),
            "agent_peak_mb": round(agent_mb, 1) if agent_mb is not None else None,
            "seconds": round(elapsed, 1),
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", default="1,4,8", help="concurrencies, comma-separated")
    args = parser.parse_args()
    payload = body()
    rows = [measure(int(n), payload) for n in args.calls.split(",")]
    meets = all(
        set(r["statuses"]) <= {200, 429}  # a call past the budget's wait answers 429: fine
        and r["server_peak_growth_mb"] < GOAL_SERVER_GROWTH_MB
        and (r["agent_peak_mb"] or GOAL_AGENT_MB) < GOAL_AGENT_MB
        for r in rows
    )
    result = {
        "rows": rows,
        "goal": {"server_peak_growth_mb_below": GOAL_SERVER_GROWTH_MB, "agent_mb_below": 40},
        "meets_goal": meets,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    print(f"{'calls at once':<14}{'200s':>6}{'server peak +':>15}{'kept':>8}{'agent':>9}", end="")
    print(f"{'time':>8}")
    for r in rows:
        agent = f"{r['agent_peak_mb']:.0f} MB" if r["agent_peak_mb"] is not None else "dead"
        print(
            f"{r['calls']:<14}{r['ok']:>6}{r['server_peak_growth_mb']:>12} MB"
            f"{r['server_kept_mb']:>5} MB{agent:>9}{r['seconds']:>7.1f}s"
        )
    print(
        f"goal: 200 or 429 only, server peak growth < {GOAL_SERVER_GROWTH_MB} MB, agent < "
        f"{GOAL_AGENT_MB} MB: {'met' if meets else 'MISSED'}"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
