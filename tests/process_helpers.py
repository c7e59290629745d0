"""What the suite's ``shellbox`` subprocesses (``serve`` in ``conftest.ServerProcess``,
``node`` in ``node_helpers.NodeProcess``) share: a free loopback port, a state directory,
starting until ``/healthz`` answers, and stopping, cleanly or as a crash would."""

from __future__ import annotations

import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_state_dir(prefix: str = "shellbox-test-") -> Path:
    """A state directory the containers' root uid can traverse (not pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


class ChildProcess:
    """A ``shellbox`` command in a subprocess (``proc``), its output in a log file."""

    proc: subprocess.Popen[bytes] | None

    def log(self) -> str:
        """The end of its log, for a failure's message."""
        raise NotImplementedError

    def launch(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        health_url: str,
        timeout_s: float,
    ) -> None:
        """Start ``argv`` and wait until ``health_url`` answers 200."""
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        what = argv[3] if len(argv) > 3 else argv[0]  # python -m shellbox.cli <what>
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited: {self.log()}")
            try:
                if httpx.get(health_url, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{what} did not start: {self.log()}")

    def kill(self) -> None:
        """Stop it uncleanly (SIGKILL), as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
