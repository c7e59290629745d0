"""Benchmark: calls/s through a cluster on this machine (HAProxy, two API replicas, two sandbox
nodes, PostgreSQL: ``shellbox.cluster.local``, what ``scripts/cluster.sh`` starts) next to one
``shellbox serve`` on the same machine, in the same run.

For each setup: 16 clients, one container each, run ``true`` calls for ``--seconds`` (keep-alive
httpx); the rounds alternate between the two setups; the figure is the median of the rounds'
calls/s, with the ``true`` round trip's median latency. On one machine the cluster's extra hops
(HAProxy, replica -> node over HTTP, PostgreSQL) cost CPU the single server does not spend:
this measures that overhead, not the scaling a cluster buys with more machines.

Run: ``.venv/bin/python bench/bench_cluster.py [--rounds N] [--seconds S]``. Prints a table and
writes ``bench/results/cluster.json``. Needs root, PostgreSQL, HAProxy and the sandbox image
(./scripts/setup.sh and ``shellbox image build``), like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench_http import Server
from shellbox.cluster.local import LocalCluster
from shellbox.sandbox import hostns

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
CONCURRENCY = 16
BODY = {"type": "shell_call", "call_id": "call_bench", "action": {"commands": ["true"]}}


async def throughput(url: str, key: str, seconds: float) -> dict[str, float]:
    """calls/s and the median round trip of ``true`` calls by CONCURRENCY clients."""
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    headers = {"authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as http:
        cids = [
            (await http.post("/v1/containers", json={"name": "bench"})).json()["id"]
            for _ in range(CONCURRENCY)
        ]
        latencies: list[float] = []
        errors = 0

        async def loop(cid: str, stop: float) -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                r = await http.post(f"/v1/containers/{cid}/calls", json=BODY)
                latencies.append(time.perf_counter() - t0)
                errors += r.status_code != 200

        await asyncio.gather(*(loop(c, time.perf_counter() + 1) for c in cids))  # warm-up
        latencies.clear()
        errors = 0
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(c, t0 + seconds) for c in cids))
        elapsed = time.perf_counter() - t0
        for cid in cids:
            await http.delete(f"/v1/containers/{cid}")
    return {
        "calls_per_s": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    single = Server({"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0"})
    root = Path(tempfile.mkdtemp(prefix="shellbox-bench-cluster-", dir="/var/tmp"))
    cluster = LocalCluster(root, IMAGE_DIR).start()
    rounds: dict[str, list[dict[str, float]]] = {"serve": [], "cluster": []}
    try:
        key = cluster.shellbox("keys", "create", "--project", "bench")
        for _ in range(args.rounds):
            rounds["serve"].append(asyncio.run(throughput(single.url, single.key, args.seconds)))
            rounds["cluster"].append(asyncio.run(throughput(cluster.root_url, key, args.seconds)))
    finally:
        single.stop()
        cluster.destroy_sandboxes()
        cluster.stop()
        for i in range(1, cluster.nodes + 1):
            hostns.detach(str(root / f"node{i}" / "disks"))
        shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "concurrency": CONCURRENCY,
        "seconds": args.seconds,
        "rounds": rounds,
    }
    for name, runs in rounds.items():
        result[name] = {
            "calls_per_s_median": round(statistics.median(r["calls_per_s"] for r in runs), 1),
            "p50_ms_median": round(statistics.median(r["p50_ms"] for r in runs), 2),
            "errors": sum(int(r["errors"]) for r in runs),
        }
    result["ratio_cluster_to_serve"] = round(
        result["cluster"]["calls_per_s_median"] / result["serve"]["calls_per_s_median"], 3
    )
    print(f"{'setup':<40} {'calls/s (median)':>17} {'true p50 ms':>12} {'errors':>7}")
    labels = {
        "serve": "one shellbox serve",
        "cluster": "HAProxy + 2 API replicas + 2 nodes + PG",
    }
    for name, label in labels.items():
        r = result[name]
        cells = f"{r['calls_per_s_median']:>17} {r['p50_ms_median']:>12} {r['errors']:>7}"
        print(f"{label:<40} {cells}")
    print(f"cluster / serve: {result['ratio_cluster_to_serve']}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
