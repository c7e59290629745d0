"""What a node costs: the same runtime used in this process, and through ``RemoteRuntime`` to
a ``shellbox node`` subprocess on a loopback port.

    .venv/bin/python bench/bench_remote.py [--calls N] [--creates N] [--binary crun|runc]

Measured side by side, rounds interleaved (local, then remote, one after the other, so that
the machine's load falls on both alike):

* a ``true`` round trip (``Runtime.run``): the agent's round trip, plus an HTTP request and
  an NDJSON stream for the remote one;
* create-to-first-result: ``create`` + ``start`` + ``run(["echo hi"])`` of a new container,
  200 ms apart (then destroyed, outside the timing);
* a 16 MiB file written and read back (``write_file`` + ``read_file``), streamed.

Prints medians, p90 and the ratio remote/local, and writes ``bench/results/remote.json``.
Needs root and the sandbox image, like the tests. Target: a node adds at most 2 ms to a
round trip and 10 ms to a creation on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, ExecRequest, Runtime, create_runtime
from shellbox.sandbox.remote import RemoteRuntime
from shellbox.settings import Settings

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = REPO / "bench" / "results" / "remote.json"
TARGETS = {"true_rt_added_ms": 2.0, "create_added_ms": 10.0}
FILE_BYTES = 16 << 20


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 3), "p90": round(pct(values, 0.9), 3)}


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await fn()
    return (time.perf_counter() - started) * 1000


def state_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


def start_node(state: Path, binary: str) -> tuple[subprocess.Popen[bytes], str, str]:
    keys = Path(tempfile.mkdtemp(prefix="shellbox-bench-key-"))
    key = secrets.token_urlsafe(32)
    (keys / "cluster.key").write_text(key + "\n")
    (keys / "cluster.key").chmod(0o600)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, SHELLBOX_RUNTIME__IMAGE_DIR=str(IMAGE_DIR))
    env["SHELLBOX_RUNTIME__TYPE"] = binary
    log = open(state / "node.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "shellbox.cli", "node", "--state-dir", str(state),
         "--listen", f"127.0.0.1:{port}", "--cluster-key-file", str(keys / "cluster.key")],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        if proc.poll() is not None:
            raise RuntimeError((state / "node.log").read_text()[-3000:])
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                shutil.rmtree(keys, ignore_errors=True)
                return proc, url, key
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the node did not start")


async def first_result(rt: Runtime) -> tuple[float, str]:
    cid = new_id("cntr_")

    async def go() -> None:
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)
        [r] = await rt.run(cid, ExecRequest(["echo hi"], 10_000, 1000))
        assert r.stdout == "hi\n", r

    return await timed(go), cid


async def body(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1 << 20):
        yield data[i : i + (1 << 20)]


async def file_round_trip(rt: Runtime, cid: str, data: bytes) -> float:
    async def go() -> None:
        await rt.write_file(cid, "bench.bin", body(data))
        got = 0
        async for chunk in await rt.read_file(cid, "bench.bin"):
            got += len(chunk)
        assert got == len(data)

    return await timed(go)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="true round trips per side")
    parser.add_argument("--creates", type=int, default=20, help="containers per side")
    parser.add_argument("--files", type=int, default=10, help="16 MiB round trips per side")
    parser.add_argument("--binary", choices=["crun", "runc"], default="crun")
    args = parser.parse_args()

    local_state, node_state = state_dir("shellbox-bench-local-"), state_dir("shellbox-bench-node-")
    settings = Settings(
        state_dir=local_state, runtime={"image_dir": IMAGE_DIR, "type": args.binary}
    )
    local = create_runtime(settings)
    proc, url, key = start_node(node_state, args.binary)
    remote = RemoteRuntime(url, key)
    sides: dict[str, Runtime] = {"local": local, "remote": remote}
    made: dict[str, list[str]] = {"local": [], "remote": []}
    times: dict[str, dict[str, list[float]]] = {
        s: {"true_rt_ms": [], "create_to_first_result_ms": [], "file_16mib_rt_ms": []}
        for s in sides
    }
    try:
        for _ in range(args.creates):
            for side, rt in sides.items():
                ms, cid = await first_result(rt)
                times[side]["create_to_first_result_ms"].append(ms)
                await rt.destroy(cid)
                await asyncio.sleep(0.2)
        boxes = {}
        for side, rt in sides.items():
            _, boxes[side] = await first_result(rt)
            made[side].append(boxes[side])
        true = ExecRequest(["true"], 10_000, 1000)
        for _ in range(args.calls):
            for side, rt in sides.items():
                cid = boxes[side]
                times[side]["true_rt_ms"].append(await timed(lambda rt=rt, c=cid: rt.run(c, true)))
        data = os.urandom(FILE_BYTES)
        for _ in range(args.files):
            for side, rt in sides.items():
                ms = await file_round_trip(rt, boxes[side], data)
                times[side]["file_16mib_rt_ms"].append(ms)
    finally:
        for side, rt in sides.items():
            for cid in made[side]:
                await rt.destroy(cid)
        await remote.aclose()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        for d in (local_state, node_state):
            subprocess.run(["umount", "-l", str(d / "disks")], capture_output=True)
            shutil.rmtree(d, ignore_errors=True)

    results: dict[str, Any] = {"binary": args.binary}
    print(f"{'':32} {'local p50':>10} {'remote p50':>11} {'ratio':>7} {'added':>8}")
    for name in times["local"]:
        lo, re_ = summary(times["local"][name]), summary(times["remote"][name])
        ratio = re_["p50"] / lo["p50"] if lo["p50"] else float("nan")
        added = re_["p50"] - lo["p50"]
        results[name] = {"local": lo, "remote": re_, "ratio": round(ratio, 2),
                         "added_p50_ms": round(added, 3)}  # fmt: skip
        print(f"{name:32} {lo['p50']:10.2f} {re_['p50']:11.2f} {ratio:7.2f} {added:8.2f}")
    results["targets"] = TARGETS
    results["meets_targets"] = {
        "true_rt": results["true_rt_ms"]["added_p50_ms"] <= TARGETS["true_rt_added_ms"],
        "create": results["create_to_first_result_ms"]["added_p50_ms"]
        <= TARGETS["create_added_ms"],
    }
    results["cpus"] = os.cpu_count()
    results["python"] = platform.python_version()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"targets met: {results['meets_targets']}; wrote {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
