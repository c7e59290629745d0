"""Host-side helpers for the sandbox tests: probes that look at the host, not the container."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from shellbox.sandbox import CommandResult, ExecRequest, OciRuntime, hostns

REPO = Path(__file__).resolve().parent.parent.parent
IMAGE_DIR = REPO / ".state" / "images"
# How much slower than this host the tests run: scripts/test-v2.sh sets it for its emulated
# guest (10-15x slower), where a fork bomb needs more than 3 s to reach a pids limit.
TIME_SCALE = float(os.environ.get("SHELLBOX_TEST_TIME_SCALE", "1"))


def remove_state_dir(path: Path) -> None:
    """The state directory and the runtime's volatile directory for it in /run."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
    hostns.detach(str(path / "disks"))  # its loop device goes with this process's last mount
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(Path("/run/shellbox") / key, ignore_errors=True)


def make_state_dir(prefix: str = "shellbox-test-") -> Path:
    """A state directory the containers' root uid can traverse (not pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


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


async def wait_gone(pattern: str, timeout_s: float = 3.0) -> list[int]:
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
