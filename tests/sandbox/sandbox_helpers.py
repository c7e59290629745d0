"""Host-side helpers for the sandbox tests: probes that look at the host, not the container."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import waiting
from process_helpers import make_state_dir as make_state_dir
from process_helpers import remove_state_dir as remove_state_dir
from shellbox.sandbox import CommandResult, ExecRequest, OciRuntime

REPO = Path(__file__).resolve().parent.parent.parent
IMAGE_DIR = REPO / ".state" / "images"
# How much slower than this host the tests run: scripts/test-v2.sh sets it for its emulated
# guest (10-15x slower), where a fork bomb needs more than 3 s to reach a pids limit.
TIME_SCALE = float(os.environ.get("SHELLBOX_TEST_TIME_SCALE", "1"))
# ``waiting.WAIT_S``, scaled for the emulated guest.
WAIT_S = waiting.WAIT_S * TIME_SCALE


async def run1(
    rt: OciRuntime, cid: str, command: str, *, timeout_ms: int = 20_000, cap: int = 16_384
) -> CommandResult:
    [result] = await rt.run(cid, ExecRequest([command], timeout_ms, cap))
    return result


def host_pids(pattern: str) -> list[int]:
    """Pids of host processes whose command line contains ``pattern`` (``pgrep -f``)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    me = os.getpid()
    return [int(p) for p in out.stdout.split() if int(p) != me]


async def wait_gone(pattern: str, timeout_s: float = WAIT_S) -> list[int]:
    """Wait until no host process matches; returns the survivors (empty when all died)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = host_pids(pattern)
        if not pids or time.monotonic() > deadline:
            return pids
        await asyncio.sleep(0.05)


def status_kb(pid: int, field: str) -> int:
    """A ``VmRSS``/``VmHWM``-style field of ``/proc/<pid>/status``, in kB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)
