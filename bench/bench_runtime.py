"""Sandbox runtime benchmark: container start, command round trip, concurrency, idle memory.

    .venv/bin/python bench/bench_runtime.py [--quick] [--binary crun|runc] [--profile P]
        [--storage btrfs|none]

Prints a table (medians, p90, the target beside each number, ratios against the baselines)
and writes ``bench/results/runtime.json`` (``runtime-runc.json`` for runc,
``runtime-minimal.json`` for the minimal image). Needs root and
the sandbox image (``.venv/bin/shellbox image build --state-dir .state``). Targets, not
tests: the numbers move with the machine's load (other work on a 2-vCPU machine is noise).

What is measured, in one run, side by side:

* cold create-to-first-result: ``create`` + ``start`` + ``run(["echo hi"])`` of a new
  container, each one 200 ms after the previous (a container is not created right after
  another one on a real server: that matters here, see ``warm_cgroup_migration``);
* a ``true`` round trip through the agent, back to back and spaced 200 ms apart, against
  ``subprocess.run(["true"])`` on the host and ``crun exec`` into the same container;
* podman run/exec when podman is installed;
* 50 containers created and started concurrently (wall time), and destroyed;
* an idle container's host memory: its memory cgroup's charge, and the PSS of its processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from shellbox.sandbox import ContainerSpec, ExecRequest, OciRuntime, create_runtime
from shellbox.settings import Settings

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "runtime.json"
TARGETS = {
    "create_to_first_result_ms": 25.0,
    "agent_true_rt_ms": 2.0,
    "concurrent_50_s": 1.0,
    "idle_memory_mb": 15.0,
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": statistics.median(values),
        "p90": pct(values, 0.9),
        "min": min(values),
        "n": len(values),
    }


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await fn()
    return (time.perf_counter() - t) * 1000


async def bench_create(rt: OciRuntime, n: int, gap_s: float) -> list[float]:
    out = []
    for i in range(n):
        cid = f"bench-cold-{i}"

        async def go(cid: str = cid) -> None:
            await rt.create(ContainerSpec(id=cid))
            await rt.start(cid)
            [r] = await rt.run(cid, ExecRequest(["echo hi"], 10_000, 1000))
            assert r.stdout == "hi\n", r

        out.append(await timed(go))
        await rt.destroy(cid)
        await asyncio.sleep(gap_s)
    return out


async def bench_disk(rt: OciRuntime, n: int) -> tuple[list[float], list[float]]:
    """``create`` alone (the disk with its quota, the container directory) and ``destroy``
    of a container never started: what the storage adds to a container's life."""
    created, destroyed = [], []
    for i in range(n):
        cid = f"bench-disk-{i}"
        created.append(await timed(lambda cid=cid: rt.create(ContainerSpec(id=cid))))
        destroyed.append(await timed(lambda cid=cid: rt.destroy(cid)))
    return created, destroyed


async def bench_agent_rt(rt: OciRuntime, cid: str, n: int, gap_s: float) -> list[float]:
    request = ExecRequest(["true"], 10_000, 1000)
    out = []
    for _ in range(n):
        out.append(await timed(lambda: rt.run(cid, request)))
        if gap_s:
            await asyncio.sleep(gap_s)
    return out


def bench_subprocess(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["true"], check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def bench_oci_exec(rt: OciRuntime, cid: str, n: int) -> list[float]:
    """``crun exec`` (the runtime's fallback path) of ``true`` as the sandbox user."""
    request = ExecRequest(["true"], 10_000, 1000)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        [r] = await rt._exec_fallback(cid, request)
        out.append((time.perf_counter() - t) * 1000)
        assert r.outcome.exit_code == 0, r
    return out


async def bench_concurrent(rt: OciRuntime, n: int) -> tuple[float, float]:
    ids = [f"bench-conc-{i}" for i in range(n)]

    async def one(cid: str) -> None:
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in ids))
    created = time.perf_counter() - t
    results = await asyncio.gather(*(rt.run(c, ExecRequest(["echo ok"], 10_000, 100)) for c in ids))
    assert all(r[0].stdout == "ok\n" for r in results)
    t = time.perf_counter()
    await asyncio.gather(*(rt.destroy(c) for c in ids))
    return created, time.perf_counter() - t


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


async def bench_idle_memory(rt: OciRuntime) -> dict[str, float]:
    """Several idle containers; per container: memory cgroup charge and PSS of its processes."""
    ids = [f"bench-idle-{i}" for i in range(5)]
    for cid in ids:
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)
        await rt.run(cid, ExecRequest(["echo warm"], 10_000, 100))
    await asyncio.sleep(1.0)
    charged, pss, rss = [], [], []
    for cid in ids:
        usage = await rt.memory_usage(cid)
        if usage is not None:
            charged.append(usage / 2**20)
        pids = sorted(rt.cgroups.pids(cid))  # its cgroup and the agent's sub-cgroups
        pss.append(sum(_pss_kb(p) for p in pids) / 1024)
        rss_kb = 0
        for p in pids:
            with open(f"/proc/{p}/status") as f:
                rss_kb += sum(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
        rss.append(rss_kb / 1024)
    for cid in ids:
        await rt.destroy(cid)
    return {
        "cgroup_charge_mb": statistics.median(charged) if charged else float("nan"),
        "pss_mb": statistics.median(pss),
        "rss_mb": statistics.median(rss),
    }


def podman_numbers() -> dict[str, Any]:
    if shutil.which("podman") is None:
        return {"installed": False}
    image = "docker.io/library/debian:bookworm-slim"
    ulimits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
    runs, execs = [], []
    try:
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run(
                ["podman", "run", "--rm", *ulimits, image, "true"], check=True, capture_output=True
            )
            runs.append((time.perf_counter() - t) * 1000)
        cid = subprocess.run(
            ["podman", "run", "-d", *ulimits, image, "sleep", "600"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        try:
            for _ in range(10):
                t = time.perf_counter()
                subprocess.run(["podman", "exec", cid, "true"], check=True, capture_output=True)
                execs.append((time.perf_counter() - t) * 1000)
        finally:
            subprocess.run(["podman", "rm", "-f", cid], capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return {"installed": True, "error": str(exc)}
    return {"installed": True, "run_ms": summary(runs), "exec_ms": summary(execs)}


def fmt(x: float) -> str:
    return f"{x:8.2f}"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--binary", choices=["crun", "runc"], default="crun")
    parser.add_argument(
        "--profile", choices=["default", "minimal"], default="default", help="sandbox image"
    )
    parser.add_argument(
        "--storage",
        choices=["btrfs", "none"],
        default="btrfs",
        help="containers' disks: btrfs subvolumes with a quota, or plain directories",
    )
    args = parser.parse_args()
    n_cold, n_rt, n_sparse, n_exec = (8, 100, 10, 20) if args.quick else (30, 400, 40, 60)

    state = Path(tempfile.mkdtemp(prefix="shellbox-bench-", dir="/var/tmp"))
    state.chmod(0o711)
    settings = Settings(
        state_dir=state,
        runtime={
            "image_dir": REPO / ".state" / "images",
            "type": args.binary,
            "image_profile": args.profile,
        },
        storage={"backend": args.storage},
    )
    rt = create_runtime(settings)
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "binary": args.binary,
            "image": rt.image_rootfs.parent.name,
            "storage": args.storage,
            "cgroups": rt.cgroups.mode.value,
        }
    }
    try:
        # Warm-up: the first start compiles and caches the seccomp filter.
        await bench_create(rt, 2, 0.0)
        cold = await bench_create(rt, n_cold, 0.2)
        disk_create, disk_destroy = await bench_disk(rt, n_rt // 4)
        cid = "bench-rt"
        await rt.create(ContainerSpec(id=cid))
        await rt.start(cid)
        await bench_agent_rt(rt, cid, 20, 0)
        agent_rt = await bench_agent_rt(rt, cid, n_rt, 0)
        agent_sparse = await bench_agent_rt(rt, cid, n_sparse, 0.2)
        sub = bench_subprocess(n_rt)
        oci_exec = await bench_oci_exec(rt, cid, n_exec)
        await rt.destroy(cid)
        created_s, destroyed_s = await bench_concurrent(rt, 50)
        idle = await bench_idle_memory(rt)
        podman = podman_numbers()
    finally:
        for info in await rt.list():
            await rt.destroy(info.id)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(rt.run_base, ignore_errors=True)

    results.update(
        {
            "create_to_first_result_ms": summary(cold),
            "create_only_ms": summary(disk_create),
            "destroy_unstarted_ms": summary(disk_destroy),
            "agent_true_rt_ms": summary(agent_rt),
            "agent_true_rt_spaced_ms": summary(agent_sparse),
            "subprocess_true_ms": summary(sub),
            "oci_exec_true_ms": summary(oci_exec),
            "concurrent_50_s": created_s,
            "concurrent_50_destroy_s": destroyed_s,
            "idle_memory_mb": idle,
            "podman": podman,
            "targets": TARGETS,
        }
    )
    parts = (args.binary, args.profile, args.storage)
    suffix = "".join(f"-{x}" for x in parts if x not in ("crun", "default", "btrfs"))
    out = RESULTS.with_name(f"runtime{suffix}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))

    rt_p50 = results["agent_true_rt_ms"]["p50"]
    print(
        f"shellbox runtime benchmark ({args.binary}, image {args.profile}, "
        f"storage {args.storage}, "
        f"cgroups {rt.cgroups.mode.value}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})"
    )
    print(f"{'measure':44s} {'p50':>8s} {'p90':>8s}   target / note")
    rows = [
        ("cold create -> first echo result (ms)", cold, "p50 <= 25 ms"),
        ("create() alone: disk, quota, directory (ms)", disk_create, ""),
        ("destroy() of an unstarted container (ms)", disk_destroy, ""),
        ("true via agent, back to back (ms)", agent_rt, "p50 <= 2 ms"),
        ("true via agent, 200 ms apart (ms)", agent_sparse, ""),
        ("subprocess.run(['true']) on the host (ms)", sub, "baseline"),
        (f"{args.binary} exec true, same container (ms)", oci_exec, "baseline"),
    ]
    for label, values, note in rows:
        s = summary(values)
        print(f"{label:44s} {fmt(s['p50'])} {fmt(s['p90'])}   {note}")
    print(f"{'50 containers created concurrently (s)':44s} {fmt(created_s)} {'':8s}   < 1 s")
    print(f"{'50 containers destroyed concurrently (s)':44s} {fmt(destroyed_s)}")
    print(
        f"{'idle container, memory cgroup charge (MB)':44s} "
        f"{fmt(idle['cgroup_charge_mb'])} {'':8s}   <= 15 MB"
    )
    print(f"{'idle container, PSS of its processes (MB)':44s} {fmt(idle['pss_mb'])}")
    if podman.get("installed"):
        if "error" in podman:
            print(f"podman: {podman['error']}")
        else:
            print(f"{'podman run --rm true (ms)':44s} {fmt(podman['run_ms']['p50'])}")
            print(f"{'podman exec true (ms)':44s} {fmt(podman['exec_ms']['p50'])}")
    else:
        print(f"{'podman':44s} not installed")
    sub50 = statistics.median(sub)
    print(
        f"ratios (p50): agent rt / subprocess {rt_p50 / sub50:.1f}x, "
        f"{args.binary} exec / agent rt {statistics.median(oci_exec) / rt_p50:.1f}x, "
        f"spaced / back-to-back {statistics.median(agent_sparse) / rt_p50:.1f}x"
    )
    print(f"written: {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
