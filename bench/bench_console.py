"""Benchmark: the operator console's first paint on loopback (goal < 200 ms).

Headless Debian chromium (Playwright, never its own browsers) logs in to a real ``shellbox
serve`` subprocess with 20 containers, then loads the container list and a container's page
again and again; each load's ``first-contentful-paint`` (the Performance API, from navigation
start) and the server's time to the HTML's last byte (``responseEnd``) are recorded.

Run: ``.venv/bin/python bench/bench_console.py [--runs N]``. Prints a table and writes
``bench/results/console.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

from bench_http import Server, shell_call, summary

RESULTS = Path(__file__).resolve().parent / "results" / "console.json"
GOAL_MS = 200.0
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TIMINGS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  return [fcp ? fcp.startTime : null, nav.responseEnd];
}"""


def measure(server: Server, cid: str, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
        page.goto(f"{server.url}/console/login")
        page.fill("#key", server.key)
        page.click("button[type=submit]")
        page.wait_for_url(f"{server.url}/console")
        for name, url in (
            ("list", f"{server.url}/console"),
            ("container", f"{server.url}/console/containers/{cid}"),
        ):
            paints, html = [], []
            for i in range(runs + 3):
                page.goto(url)
                page.wait_for_function(
                    "() => performance.getEntriesByName('first-contentful-paint').length > 0"
                )
                fcp, response_end = page.evaluate(TIMINGS)
                if i >= 3:  # warm-up: the browser's caches, the server's first requests
                    paints.append(fcp / 1000)
                    html.append(response_end / 1000)
            out[f"{name}_first_paint"] = paints
            out[f"{name}_html"] = html
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    server = Server({})
    try:
        with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60) as http:
            cids = [
                http.post("/v1/containers", json={"name": f"bench-{i}"}).json()["id"]
                for i in range(20)
            ]
            http.post(
                f"/v1/containers/{cids[0]}/calls",
                json=shell_call("for i in $(seq 20); do echo $i > file-$i.txt; done"),
            )
        samples = measure(server, cids[0], args.runs)
    finally:
        server.stop()
    results: dict[str, Any] = {name: summary(s) for name, s in samples.items()}
    print(f"{'page':<24} {'p50 ms':>8} {'p99 ms':>8}")
    for name, row in results.items():
        print(f"{name:<24} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}")
    worst = max(results["list_first_paint"]["p50_ms"], results["container_first_paint"]["p50_ms"])
    print(f"goal: first paint < {GOAL_MS:g} ms: {'met' if worst < GOAL_MS else 'NOT met'}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"machine": platform.node(), "runs": args.runs, "goal_ms": GOAL_MS, "results": results},
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
