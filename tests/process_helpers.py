"""What the suite's ``shellbox`` subprocesses (``serve`` in ``conftest.ServerProcess``,
``node`` in ``node_helpers.NodeProcess``) share: a free loopback port, a state directory
and its removal, starting until ``/healthz`` answers, stopping, cleanly or as a crash would,
and destroying what a server left."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from shellbox.sandbox import hostns, storage_config
from shellbox.sandbox.cgroups import HostCgroups, detect_mode
from shellbox.sandbox.crun import OciRuntime, remove_stale_run_dir
from shellbox.sandbox.image import image_for
from shellbox.sandbox.run_dirs import run_base_for
from shellbox.settings import Settings

IMAGE_DIR = Path(__file__).resolve().parent.parent / ".state" / "images"
# How long a server or node may take to answer its health check after it was started: a
# bound, not an expectation (a few seconds on a quiet host; on one at load average 100-400
# importing the server's modules alone can take a minute).
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_state_dir(prefix: str = "shellbox-test-") -> Path:
    """A state directory the containers' root uid can traverse (not pytest's 0700 tmp)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    return path


def remove_state_dir(path: Path) -> None:
    """The state directory, and the runtime's volatile directory for it in /run with the
    cgroups of the dead containers it records. A container still running there (its server
    killed, never destroyed) fails the caller: ``destroy_all_sandboxes`` first."""
    run_dir = run_base_for(path)
    hostns.detach(str(path / "disks"))  # its loop device goes with this process's last mount
    shutil.rmtree(path, ignore_errors=True)
    if run_dir.is_dir() and not remove_stale_run_dir(run_dir, HostCgroups(detect_mode())):
        msg = f"containers of the removed state directory {path} still run (see {run_dir})"
        raise AssertionError(msg)


def destroy_all_sandboxes(state_dir: Path) -> None:
    """Remove every container a test server or node left (its processes, cgroups, files),
    whether it still runs or not."""

    async def go() -> None:
        # The storage backend the servers had: from the environment, as theirs.
        config = storage_config(Settings(state_dir=state_dir))
        rt = OciRuntime(state_dir, image_for(IMAGE_DIR, "minimal").path, storage_config=config)
        for info in await rt.list():
            await rt.destroy(info.id)

    asyncio.run(go())


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
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Start ``argv`` and wait until ``health_url`` answers 200 (an https one checked
        with ``verify``)."""
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
                if httpx.get(health_url, timeout=1, verify=verify).status_code == 200:
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
