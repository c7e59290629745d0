"""Benchmark: the HTTP server's overhead over the sandbox runtime it drives.

Through HTTP, with keep-alive httpx clients against a real ``shellbox serve`` subprocess (with
an API key, so every request authenticates), next to the same operation done directly through
``OciRuntime`` in this process, in the same run:

* create-to-first-result (the public sandbox leaderboards' method): create a container, run
  ``echo``, read the result; p50/p99, with the default warm pool (containers started ahead of
  time, ``lifecycle.warm_pool_size``) and without one (every container started on demand);
* ``true`` round trip in a running container; p50/p99;
* calls/s at concurrency 16 (16 clients, one container each) for a few seconds, with errors.

Targets: create-to-first-result p50 <= 50 ms; ``true`` p50 <= 5 ms; >= 300 calls/s at
concurrency 16 with no errors.

Run: ``.venv/bin/python bench/bench_http.py [--runs N] [--seconds S]``. Prints a table and
writes ``bench/results/http.json``. Needs root and the sandbox image (./scripts/setup.sh and
``shellbox image build``), like the tests.
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
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from bench_server import stop_server, wait_healthy
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, OciRuntime, create_runtime
from shellbox.settings import Settings

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = Path(__file__).resolve().parent / "results" / "http.json"
CONCURRENCY = 16
TARGETS = {"create_to_first_result_p50_ms": 50.0, "true_p50_ms": 5.0, "calls_per_s": 300.0}


def pct(samples: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), in milliseconds."""
    ordered = sorted(samples)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k] * 1000


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(samples) * 1000, 3),
        "p99_ms": round(pct(samples, 99), 3),
        "n": len(samples),
    }


def state_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)  # the containers' root uid must traverse it
    return path


# -- the server ---------------------------------------------------------------------------------


class Server:
    def __init__(self, env: dict[str, str], python: str | None = None) -> None:
        """A ``shellbox serve`` subprocess; ``python``: another checkout's interpreter (its
        venv runs that checkout's code), for a baseline measured in the same run."""
        self.dir = state_dir("shellbox-bench-srv-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.env = {**os.environ, "SHELLBOX_RUNTIME__IMAGE_DIR": str(IMAGE_DIR), **env}
        cli = [python or sys.executable, "-m", "shellbox.cli"]
        self.key = subprocess.run(
            [*cli, "keys", "create", "--project", "bench", "--state-dir", str(self.dir)],
            check=True,
            capture_output=True,
            text=True,
            env=self.env,
        ).stdout.strip()
        self.log = open(self.dir / "server.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*cli, "serve", "--state-dir", str(self.dir), "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_healthy(self.url, self.proc, self.dir / "server.log")

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"}

    def stop(self) -> None:
        stop_server(self.proc, self.log)
        runtime = OciRuntime(self.dir, image_path())
        for info in asyncio.run(runtime.list()):
            asyncio.run(runtime.destroy(info.id))
        shutil.rmtree(self.dir, ignore_errors=True)


def image_path() -> Path:
    from shellbox.sandbox.image import image_for

    return image_for(IMAGE_DIR, "minimal").path


def shell_call(*commands: str) -> dict[str, Any]:
    return {"type": "shell_call", "call_id": "call_bench", "action": {"commands": list(commands)}}


# -- HTTP measurements --------------------------------------------------------------------------


def http_create_to_first_result(server: Server, runs: int, pause_s: float) -> list[float]:
    samples = []
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60) as http:
        for _ in range(runs):
            t0 = time.perf_counter()
            c = http.post("/v1/containers", json={"name": "bench"})
            cid = c.json()["id"]
            r = http.post(f"/v1/containers/{cid}/calls", json=shell_call("echo hello"))
            out = r.json()["output"][0]["stdout"]
            samples.append(time.perf_counter() - t0)
            assert out == "hello\n", r.text
            http.delete(f"/v1/containers/{cid}")
            time.sleep(pause_s)  # the pace of a real client, and time for the warm pool
    return samples


def http_true_round_trip(server: Server, runs: int) -> list[float]:
    samples = []
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60) as http:
        cid = http.post("/v1/containers", json={"name": "bench"}).json()["id"]
        body = shell_call("true")
        for _ in range(20):  # warm up the connection and the container
            http.post(f"/v1/containers/{cid}/calls", json=body)
        for _ in range(runs):
            t0 = time.perf_counter()
            r = http.post(f"/v1/containers/{cid}/calls", json=body)
            r.json()
            samples.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
        http.delete(f"/v1/containers/{cid}")
    return samples


async def http_throughput(server: Server, seconds: float) -> dict[str, float]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=server.url, headers=server.headers(), timeout=60, limits=limits
    ) as http:
        cids = []
        for _ in range(CONCURRENCY):
            cids.append((await http.post("/v1/containers", json={"name": "load"})).json()["id"])
        body = shell_call("true")

        async def one(cid: str) -> bool:
            r = await http.post(f"/v1/containers/{cid}/calls", json=body)
            return r.status_code == 200 and r.json()["output"][0]["outcome"]["exit_code"] == 0

        result = await _drive([lambda c=c: one(c) for c in cids], seconds)  # type: ignore[misc]
        for cid in cids:
            await http.delete(f"/v1/containers/{cid}")
    return result


async def _drive(workers: list[Callable[[], Awaitable[bool]]], seconds: float) -> dict[str, float]:
    """Run each worker in a loop for ``seconds``; count completed calls and failures."""
    done = 0
    errors = 0
    stop = time.perf_counter() + seconds

    async def loop(work: Callable[[], Awaitable[bool]]) -> None:
        nonlocal done, errors
        while time.perf_counter() < stop:
            try:
                ok = await work()
            except Exception:
                ok = False
            done += 1
            errors += not ok

    for work in workers:  # warm-up round
        await work()
    t0 = time.perf_counter()
    await asyncio.gather(*(loop(w) for w in workers))
    elapsed = time.perf_counter() - t0
    return {
        "calls": done,
        "errors": errors,
        "seconds": round(elapsed, 2),
        "calls_per_s": round(done / elapsed, 1),
    }


# -- the same through the runtime ---------------------------------------------------------------


async def runtime_measurements(runs: int, true_runs: int, seconds: float) -> dict[str, Any]:
    settings = Settings(state_dir=state_dir("shellbox-bench-rt-"), runtime={"image_dir": IMAGE_DIR})
    rt = create_runtime(settings)
    echo = ExecRequest(["echo hello"], 10_000, 16_384)
    true = ExecRequest(["true"], 10_000, 16_384)
    try:
        create = []
        for _ in range(runs):
            cid = new_id("cntr_")
            t0 = time.perf_counter()
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)
            [res] = await rt.run(cid, echo)
            create.append(time.perf_counter() - t0)
            assert res.stdout == "hello\n"
            await rt.destroy(cid)
        cid = new_id("cntr_")
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)
        for _ in range(20):
            await rt.run(cid, true)
        trues = []
        for _ in range(true_runs):
            t0 = time.perf_counter()
            await rt.run(cid, true)
            trues.append(time.perf_counter() - t0)
        await rt.destroy(cid)

        cids = [new_id("cntr_") for _ in range(CONCURRENCY)]
        for c in cids:
            await rt.create(ContainerSpec(id=c))
            await rt.start(c)

        async def one(c: str) -> bool:
            [r] = await rt.run(c, true)
            return r.outcome.exit_code == 0

        load = await _drive([lambda c=c: one(c) for c in cids], seconds)  # type: ignore[misc]
        for c in cids:
            await rt.destroy(c)
        return {"create": create, "true": trues, "load": load}
    finally:
        for info in await rt.list():
            await rt.destroy(info.id)
        shutil.rmtree(settings.state_dir, ignore_errors=True)


# -- report -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="create-to-first-result samples")
    parser.add_argument("--true-runs", type=int, default=400, help="true round-trip samples")
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of the load test")
    parser.add_argument("--pause", type=float, default=0.25, help="seconds between creates")
    args = parser.parse_args()

    rt = asyncio.run(runtime_measurements(args.runs, args.true_runs, args.seconds))
    server = Server(env={})  # the default settings: a warm pool of 2
    try:
        time.sleep(1)  # let the warm pool fill
        create = http_create_to_first_result(server, args.runs, args.pause)
        trues = http_true_round_trip(server, args.true_runs)
        load = asyncio.run(http_throughput(server, args.seconds))
    finally:
        server.stop()
    cold_server = Server(env={"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0"})
    try:
        cold = http_create_to_first_result(cold_server, args.runs, 0)
    finally:
        cold_server.stop()

    rows = {
        "create_to_first_result": {"http": summary(create), "runtime": summary(rt["create"])},
        "create_to_first_result_no_pool": {
            "http": summary(cold),
            "runtime": summary(rt["create"]),
        },
        "true_round_trip": {"http": summary(trues), "runtime": summary(rt["true"])},
    }
    for row in rows.values():
        row["ratio_p50"] = round(row["http"]["p50_ms"] / row["runtime"]["p50_ms"], 2)
        row["overhead_p50_ms"] = round(row["http"]["p50_ms"] - row["runtime"]["p50_ms"], 3)
    result = {
        **rows,
        "load_concurrency_16": {
            "http": load,
            "runtime": rt["load"],
            "ratio": round(load["calls_per_s"] / rt["load"]["calls_per_s"], 2),
        },
        "targets": TARGETS,
        "meets_targets": {
            "create_to_first_result_p50": rows["create_to_first_result"]["http"]["p50_ms"]
            <= TARGETS["create_to_first_result_p50_ms"],
            "true_p50": rows["true_round_trip"]["http"]["p50_ms"] <= TARGETS["true_p50_ms"],
            "calls_per_s": load["calls_per_s"] >= TARGETS["calls_per_s"] and load["errors"] == 0,
        },
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }

    print(f"{'operation':<32}{'HTTP p50':>10}{'p99':>9}{'runtime p50':>13}{'p99':>9}{'ratio':>7}")
    for name, row in rows.items():
        h, r = row["http"], row["runtime"]
        print(
            f"{name:<28}{h['p50_ms']:>8.2f}ms{h['p99_ms']:>7.2f}ms{r['p50_ms']:>11.2f}ms"
            f"{r['p99_ms']:>7.2f}ms{row['ratio_p50']:>7.2f}"
        )
    hl, rl = load, rt["load"]
    print(
        f"{'calls/s at concurrency 16':<28}{hl['calls_per_s']:>10.1f}{'':>9}"
        f"{rl['calls_per_s']:>13.1f}{'':>9}{result['load_concurrency_16']['ratio']:>7.2f}"
        f"   errors: {hl['errors']} (runtime {rl['errors']})"
    )
    print("targets met:", json.dumps(result["meets_targets"]))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
