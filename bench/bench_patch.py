"""Benchmark: apply a 500-hunk V4A diff to a 50 000-line file, against plain file I/O.

Why this comparison: the HTTP layer reads the file, applies the patch and writes it back, so
the patch step should cost about as much as the I/O around it. The target is that applying
takes at most 3x the time of reading and writing the same file.

Run: ``.venv/bin/python bench/bench_patch.py [--runs N]``. Prints a table and writes
``bench/results/patch.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from shellbox.patch import apply_diff, apply_diff_detailed, make_diff

LINES = 50_000
HUNKS = 500
TARGET_RATIO = 3.0
BASELINE = "read+write file (baseline)"
HEADLINE = "apply_diff, anchored hunks (LF)"
RESULTS = Path(__file__).resolve().parent / "results" / "patch.json"


def build_file(lines: int = LINES, blocks: int = HUNKS) -> list[str]:
    """Python-looking source: ``blocks`` functions with repeated lines (blank, ``return``)."""
    per_block = lines // blocks
    out: list[str] = []
    for block in range(blocks):
        out.append(f"def handler_{block}(request):")
        for step in range(1, per_block - 2):
            if step % 10 == 0:
                out.append("")
            else:
                out.append(f"    value_{step} = compute(request, {step}, {block})  # step {step}")
        out.append("    return value")
        out.append("")
    return out


def build_diff(lines: list[str], blocks: int = HUNKS) -> str:
    """One anchored hunk per function: 3 lines of context, 1 removed, 2 added, 3 context."""
    per_block = len(lines) // blocks
    out: list[str] = []
    for block in range(blocks):
        base = block * per_block
        out.append(f"@@ {lines[base]}")
        changed = base + 5
        out.extend(" " + line for line in lines[changed - 3 : changed])
        out.append("-" + lines[changed])
        out.append(f"+    value_5 = compute_fast(request, 5, {block})")
        out.append(f"+    assert value_5 is not None, {block}")
        out.extend(" " + line for line in lines[changed + 1 : changed + 4])
    return "\n".join(out) + "\n"


def interleaved_medians(actions: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median seconds per action, timing the actions round-robin.

    Interleaving makes every action see the same background load, which matters more for
    the ratio than the absolute numbers on a shared machine.
    """
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for action in actions.values():
        action()  # warm-up: imports, caches, page cache
    for _ in range(runs):
        for name, action in actions.items():
            started = time.perf_counter()
            action()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def isolated_medians(actions: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median seconds per action, each timed in its own back-to-back loop (warm caches)."""
    medians: dict[str, float] = {}
    for name, action in actions.items():
        action()
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            action()
            samples.append(time.perf_counter() - started)
        medians[name] = statistics.median(samples)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="timed runs per row (median)")
    args = parser.parse_args(argv)
    runs: int = args.runs

    lines = build_file()
    text = "\n".join(lines) + "\n"
    crlf_text = text.replace("\n", "\r\n")
    diff = build_diff(lines)
    expected = apply_diff(text, diff)
    assert apply_diff(crlf_text, diff) == expected.replace("\n", "\r\n")
    generated = make_diff(text, expected)
    assert apply_diff(text, generated) == expected
    fuzz = apply_diff_detailed(text, diff).fuzz
    # Every line gets trailing blanks the diff lacks: each hunk needs the rstrip pass, so
    # this times the general line-list applier instead of the exact-match fast path.
    padded = "\n".join(line + "  " for line in lines) + "\n"
    assert apply_diff_detailed(padded, diff).fuzz >= HUNKS

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.py"
        path.write_text(text, encoding="utf-8")

        def read_write() -> None:
            content = path.read_text(encoding="utf-8")
            path.write_text(content, encoding="utf-8")

        actions: dict[str, Callable[[], object]] = {
            BASELINE: read_write,
            HEADLINE: lambda: apply_diff(text, diff),
            "apply_diff, anchored hunks (CRLF)": lambda: apply_diff(crlf_text, diff),
            "apply_diff, make_diff output": lambda: apply_diff(text, generated),
            "apply_diff, every hunk fuzzy": lambda: apply_diff(padded, diff),
        }
        rows = interleaved_medians(actions, runs)
        alone = isolated_medians(actions, runs)
    baseline, alone_baseline = rows[BASELINE], alone[BASELINE]
    ratio = rows[HEADLINE] / baseline
    alone_ratio = alone[HEADLINE] / alone_baseline
    exact = [name for name in rows if name.startswith("apply") and "fuzzy" not in name]
    worst = max(max(rows[n] / baseline, alone[n] / alone_baseline) for n in exact)
    meets = max(ratio, alone_ratio) <= TARGET_RATIO

    print(f"file: {LINES} lines, {len(text):,} chars; diff: {HUNKS} hunks, fuzz {fuzz}")
    print(f"{'':<36} {'--- interleaved ---':>22} {'---- isolated ----':>22}")
    print(f"{'case':<36} {'ms':>10} {'x baseline':>11} {'ms':>10} {'x baseline':>11}")
    for name, seconds in rows.items():
        print(
            f"{name:<36} {seconds * 1000:>10.2f} {seconds / baseline:>11.2f}"
            f" {alone[name] * 1000:>10.2f} {alone[name] / alone_baseline:>11.2f}"
        )
    print("(the target is for the anchored LF row; 'fuzzy' times the general applier)")
    print(
        f"ratio {ratio:.2f} interleaved, {alone_ratio:.2f} isolated "
        f"(worst exact case {worst:.2f}) vs target {TARGET_RATIO:.1f}: "
        f"{'OK' if meets else 'OVER TARGET'}"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "lines": LINES,
        "hunks": HUNKS,
        "chars": len(text),
        "runs": runs,
        "median_ms": {name: round(seconds * 1000, 3) for name, seconds in rows.items()},
        "isolated_median_ms": {name: round(seconds * 1000, 3) for name, seconds in alone.items()},
        "ratio": round(ratio, 3),
        "isolated_ratio": round(alone_ratio, 3),
        "worst_exact_ratio": round(worst, 3),
        "target_ratio": TARGET_RATIO,
        "meets_target": meets,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
