"""Benchmark: snapshot, fork and pause cost against the workspace's size.

Through HTTP against a real ``shellbox serve`` subprocess (warm pool off, so create and fork
both start a container on demand), for workspaces of 1 MiB and 1 GiB in ``/mnt/data`` and
one of 10,000 small files under ``/home/user`` (a fork moves every inode to its own uid range,
so that is where a fork's cost grows). Rounds are interleaved (an empty create, then each
workspace in turn), so the load of a shared machine falls on every figure alike:

* snapshot p50 (``POST /v1/containers/{id}/snapshots``), and how long the container's
  processes were frozen for it (from the server's log);
* fork-to-first-result p50 (``POST /v1/containers`` with ``snapshot_id``, then ``true``),
  next to create-to-first-result of an empty container and delete;
* pause and resume p50.

Goal (issue 16): snapshot <= 100 ms and fork-to-first-result <= create + 20 ms whatever the
size; the 1 GiB figures within 2x the 1 MiB ones.

Run: ``.venv/bin/python bench/bench_snapshots.py [--runs N]``. Prints a table and writes
``bench/results/snapshots.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
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

from bench_server import stop_server, wait_healthy
from shellbox.sandbox import OciRuntime, hostns
from shellbox.sandbox.image import image_for

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = Path(__file__).resolve().parent / "results" / "snapshots.json"
FROZEN = re.compile(r"snapshot (snap_\w+) of \w+: processes frozen ([0-9.]+) ms")
WORKSPACES = {
    "1MiB": "dd if=/dev/urandom of=/mnt/data/blob bs=1M count=1 status=none",
    "1GiB": "dd if=/dev/urandom of=/mnt/data/blob bs=1M count=1024 status=none",
    "10k files": "mkdir -p ~/.local/many && cd ~/.local/many && "
    "seq 1 10000 | xargs -n 500 touch && ls | wc -l",
}


class Server:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shellbox-bench-snap-", dir="/var/tmp"))
        self.dir.chmod(0o711)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {
            **os.environ,
            "SHELLBOX_RUNTIME__IMAGE_DIR": str(IMAGE_DIR),
            "SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0",
        }
        self.log_path = self.dir / "server.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        cli = [sys.executable, "-m", "shellbox.cli"]
        self.proc = subprocess.Popen(
            [*cli, "serve", "--state-dir", str(self.dir), "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_healthy(self.url, self.proc, self.log_path)

    def frozen_ms(self, snapshot_id: str) -> float:
        for sid, ms in FROZEN.findall(self.log_path.read_text()):
            if sid == snapshot_id:
                return float(ms)
        raise SystemExit(f"no freeze logged for {snapshot_id}")

    def stop(self) -> None:
        stop_server(self.proc, self.log)
        runtime = OciRuntime(self.dir, image_for(IMAGE_DIR, "default").path)
        for info in asyncio.run(runtime.list()):
            asyncio.run(runtime.destroy(info.id))
        for sid in asyncio.run(runtime.snapshot_ids()):
            asyncio.run(runtime.delete_snapshot(sid))
        hostns.detach(str(self.dir / "disks"))  # mounted in this process by the runtime
        shutil.rmtree(self.dir, ignore_errors=True)


def ok(r: httpx.Response) -> dict[str, Any]:
    if r.status_code != 200:
        raise SystemExit(f"{r.request.method} {r.request.url}: {r.status_code} {r.text}")
    body: dict[str, Any] = r.json()
    return body


def run(http: httpx.Client, cid: str, command: str) -> str:
    item = ok(
        http.post(
            f"/v1/containers/{cid}/calls",
            json={
                "type": "shell_call",
                "call_id": "b",
                "action": {"commands": [command], "timeout_ms": 600_000},
            },
        )
    )
    out = item["output"][0]
    if out["outcome"] != {"type": "exit", "exit_code": 0}:
        raise SystemExit(f"{command!r} failed: {out}")
    return str(out["stdout"])


def timed(fn: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


METRICS = ("snapshot", "frozen", "fork_to_first_result", "delete_fork", "pause", "resume")


def one_round(http: httpx.Client, srv: Server, origin: str, got: dict[str, list[float]]) -> str:
    """One sample of each metric on ``origin``; returns the snapshot it took."""
    dt, snap = timed(lambda: ok(http.post(f"/v1/containers/{origin}/snapshots")))
    got["snapshot"].append(dt)
    got["frozen"].append(srv.frozen_ms(snap["id"]) / 1000)

    def fork() -> str:
        body = {"name": "f", "snapshot_id": snap["id"]}
        cid = ok(http.post("/v1/containers", json=body))["id"]
        run(http, cid, "true")
        return str(cid)

    dt, cid = timed(fork)
    got["fork_to_first_result"].append(dt)
    dt, _ = timed(lambda: ok(http.delete(f"/v1/containers/{cid}")))
    got["delete_fork"].append(dt)
    dt, _ = timed(lambda: ok(http.post(f"/v1/containers/{origin}/pause")))
    got["pause"].append(dt)
    dt, _ = timed(lambda: ok(http.post(f"/v1/containers/{origin}/resume")))
    got["resume"].append(dt)
    return str(snap["id"])


def create_round(http: httpx.Client, got: dict[str, list[float]]) -> None:
    def create() -> str:
        cid = ok(http.post("/v1/containers", json={"name": "c"}))["id"]
        run(http, cid, "true")
        return str(cid)

    dt, cid = timed(create)
    got["create_to_first_result"].append(dt)
    dt, _ = timed(lambda: ok(http.delete(f"/v1/containers/{cid}")))
    got["delete"].append(dt)


def measure(http: httpx.Client, srv: Server, runs: int) -> dict[str, dict[str, float]]:
    """Rounds interleaved (create, then each workspace in turn, ``runs`` times), so the
    machine's load, shared with other work, falls on every figure alike."""
    origins = {}
    for name, fill in WORKSPACES.items():
        origins[name] = ok(http.post("/v1/containers", json={"name": name}))["id"]
        run(http, origins[name], fill)
    samples: dict[str, dict[str, list[float]]] = {
        name: {m: [] for m in METRICS} for name in WORKSPACES
    }
    base: dict[str, list[float]] = {"create_to_first_result": [], "delete": []}
    taken: dict[str, list[str]] = {name: [] for name in WORKSPACES}
    for _ in range(runs):
        create_round(http, base)
        for name, origin in origins.items():
            taken[name].append(one_round(http, srv, origin, samples[name]))
    results: dict[str, dict[str, float]] = {
        "baseline": {f"{m}_p50_ms": p50_ms(v) for m, v in base.items()}
    }
    for name, origin in origins.items():
        row = {f"{m}_p50_ms": p50_ms(v) for m, v in samples[name].items()}
        row["snapshot_bytes"] = ok(http.get(f"/v1/snapshots/{taken[name][0]}"))["bytes"]
        results[name] = row
        for sid in taken[name]:
            ok(http.delete(f"/v1/snapshots/{sid}"))
        ok(http.delete(f"/v1/containers/{origin}"))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    srv = Server()
    try:
        auth = {"authorization": "Bearer bench"}  # no keys exist: any key, on loopback
        with httpx.Client(base_url=srv.url, headers=auth, timeout=900) as http:
            results = measure(http, srv, args.runs)
    finally:
        srv.stop()
    base = results.pop("baseline")
    print(
        f"create-to-first-result p50 {base['create_to_first_result_p50_ms']} ms, "
        f"delete p50 {base['delete_p50_ms']} ms (warm pool off; medians of {args.runs})"
    )
    cols = [f"{m}_p50_ms" for m in METRICS]
    print(f"{'workspace':<10} {'bytes':>12} " + " ".join(f"{c[:-7]:>22}" for c in cols))
    for name, row in results.items():
        line = f"{name:<10} {int(row['snapshot_bytes']):>12} "
        print(line + " ".join(f"{row[c]:>22}" for c in cols))
    small, big = results["1MiB"], results["1GiB"]
    ratios = {c: round(big[c] / small[c], 2) for c in cols if small[c]}
    print("1GiB / 1MiB: " + ", ".join(f"{c[:-7]} {r}x" for c, r in ratios.items()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "kernel": platform.release(),
                "runs": args.runs,
                "baseline": base,
                "workspaces": results,
                "ratio_1GiB_over_1MiB": ratios,
            },
            indent=2,
        )
    )
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
