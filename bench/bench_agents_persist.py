"""Benchmark: the Agents SDK provider's persist_workspace and hydrate_workspace, through a
server-side snapshot reference (``workspace_persistence="auto"``) against the tar stream
(``"tar"``, the baseline), for workspaces of 1 MiB and 100 MiB in ``/mnt/data``.

Against a real ``shellbox serve`` subprocess (warm pool off), through the provider's session
objects as the SDK's stop and resume call them: persist is one call on a started session;
hydrate is one call on a freshly started session (a reference replaces its container with a
fork; a tar is unpacked into it). Rounds are interleaved (reference, then tar), so the load
of a shared machine falls on both alike.

Run: ``.venv/bin/python bench/bench_agents_persist.py [--runs N]``. Prints a table and
writes ``bench/results/agents_persist.json``. Needs root and the sandbox image.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from bench_snapshots import Server
from shellbox.client import AsyncShellbox
from shellbox.integrations.agents import ShellboxSandboxClient, ShellboxSandboxClientOptions

RESULTS = Path(__file__).resolve().parent / "results" / "agents_persist.json"
WORKSPACES = {"1MiB": 1, "100MiB": 100}
MODES = ("auto", "tar")


def p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 1)


async def started(client: ShellboxSandboxClient) -> Any:
    session = await client.create(options=ShellboxSandboxClientOptions(name="bench"))
    await session.start()
    return session


async def measure(api: AsyncShellbox, runs: int) -> dict[str, dict[str, float]]:
    client = ShellboxSandboxClient(api)
    results: dict[str, dict[str, float]] = {}
    for name, mib in WORKSPACES.items():
        source = await started(client)
        fill = f"head -c {mib << 20} /dev/urandom > blob && sync"
        await source.exec(fill, timeout=600)
        got: dict[str, list[float]] = {
            f"{k}_{m}": [] for k in ("persist", "hydrate") for m in MODES
        }
        sizes: dict[str, int] = {}
        for _ in range(runs):
            for mode in MODES:
                source.state.workspace_persistence = mode
                t0 = time.perf_counter()
                payload = (await source.persist_workspace()).read()
                got[f"persist_{mode}"].append(time.perf_counter() - t0)
                sizes[mode] = len(payload)
                target = await started(client)
                t0 = time.perf_counter()
                await target.hydrate_workspace(io.BytesIO(payload))
                got[f"hydrate_{mode}"].append(time.perf_counter() - t0)
                out = await target.exec("stat -c %s blob", timeout=60)
                assert out.stdout.decode().strip() == str(mib << 20), out
                await target.aclose()
        persisted = source.state.persisted_snapshot_id
        await source.aclose()
        if persisted is not None:
            await api.snapshots.delete(persisted)
        row = {k: p50_ms(v) for k, v in got.items()}
        row |= {f"payload_bytes_{m}": float(sizes[m]) for m in MODES}
        results[name] = row
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    srv = Server()
    try:

        async def go() -> dict[str, dict[str, float]]:
            async with AsyncShellbox(srv.url + "/v1", "bench") as api:
                return await measure(api, args.runs)

        results = asyncio.run(go())
    finally:
        srv.stop()
    print(f"p50 ms, medians of {args.runs}; baseline: tar")
    print(
        f"{'workspace':<10} {'op':<8} {'snapshot ref':>13} {'tar':>10} {'ratio':>7} {'payload':>20}"
    )
    ratios: dict[str, float] = {}
    for name, row in results.items():
        for op in ("persist", "hydrate"):
            ref, tar = row[f"{op}_auto"], row[f"{op}_tar"]
            ratios[f"{name}_{op}"] = round(ref / tar, 2)
            payload = f"{int(row['payload_bytes_auto'])} / {int(row['payload_bytes_tar'])}"
            print(f"{name:<10} {op:<8} {ref:>13} {tar:>10} {ref / tar:>6.2f}x {payload:>20}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "kernel": platform.release(),
                "runs": args.runs,
                "workspaces": results,
                "ratio_snapshot_over_tar": ratios,
            },
            indent=2,
        )
    )
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
