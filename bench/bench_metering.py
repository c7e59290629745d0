"""Benchmark: what metering adds to a direct call, which bills its sandbox time in a
transaction of its own before the answer goes out.

Measured in this process on the server's own database setup (SQLite in WAL mode, a file in a
temporary state directory): ``MeteringService.bill`` of one usage row, next to the baseline of
the same work without metering (nothing: the call path had no write before) and next to an
empty transaction (the commit alone). Compare the p50 with the ``true`` round trip of
``bench_http.py`` (tens of milliseconds on a loaded 2-core machine).

Run: ``.venv/bin/python bench/bench_metering.py [--runs N]``. Prints a table and writes
``bench/results/metering.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shellbox.service.metering import MeteringService, SandboxClock
from shellbox.service.metrics import Metrics
from shellbox.service.models import Principal
from shellbox.settings import MeteringSettings
from shellbox.store import create_database
from shellbox.store.metering import SqlStatsStore, SqlUsageStore

RESULTS = Path(__file__).resolve().parent / "results" / "metering.json"


def timed(runs: int, work: Callable[[int], None]) -> list[float]:
    out = []
    for n in range(runs):
        started = time.perf_counter_ns()
        work(n)
        out.append((time.perf_counter_ns() - started) / 1e6)
    return out


def p(samples: list[float], q: float) -> float:
    return sorted(samples)[min(len(samples) - 1, int(q * len(samples)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=2000, help="usage rows written")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="shellbox-bench-metering-"))
    try:
        db = create_database(f"sqlite:///{state / 'private' / 'shellbox.db'}")
        metering = MeteringService(
            MeteringSettings(), SqlUsageStore(db), Metrics(SqlStatsStore(db))
        )
        principal = Principal("bench", "key_bench")

        def bill(n: int) -> None:
            clock = SandboxClock()
            clock.start()
            metering.bill(metering.usage_of(f"call_{n}", principal, "cntr_bench", "call", clock))

        def empty(_n: int) -> None:
            with db.begin():
                pass

        rows = {
            "baseline (no metering)": [0.0] * args.runs,
            "empty transaction": timed(args.runs, empty),
            "bill one usage row": timed(args.runs, bill),
        }
        db.dispose()
    finally:
        shutil.rmtree(state, ignore_errors=True)
    print(f"{'operation':28} {'p50':>9} {'p99':>9}")
    result: dict[str, object] = {"machine": platform.platform(), "runs": args.runs}
    for name, samples in rows.items():
        p50, p99 = statistics.median(samples), p(samples, 0.99)
        print(f"{name:28} {p50:8.3f}ms {p99:8.3f}ms")
        result[name] = {"p50_ms": p50, "p99_ms": p99}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
