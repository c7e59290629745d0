"""Shared by the bench scripts that drive a real ``shellbox serve`` subprocess."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    """Return once ``url``/healthz answers 200; exit with the server's log if it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"server did not start: {log.read_text()}")
        time.sleep(0.05)


def stop_server(proc: subprocess.Popen[bytes], log: IO[bytes]) -> None:
    """Stop the server as an operator would (SIGTERM, then SIGKILL after 30 s); close its log.
    What it left (containers, disks) is the caller's to clean."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()
