"""Runs the egress proxy (``proxy_main.py``: mitmproxy with our addon, in ``.venv-egress``):
start, readiness, restart when it dies, stop.

The proxy is a child of the server: ``setpriv --pdeathsig TERM`` makes the kernel end it if
the server dies without stopping it, so a crashed server never leaves a proxy holding the port.
It gets a clean environment (none of the server's settings or keys) and writes its output to
``proxy.log``. Readiness is the addon's ``ready`` file (holding its pid): probing the port
from the host would not work, since nftables lets only sandboxes reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

from shellbox.egress.paths import EgressPaths
from shellbox.errors import SandboxError

log = logging.getLogger("shellbox.egress")

PROXY_MAIN = Path(__file__).resolve().with_name("proxy_main.py")
# Bodies past this size are streamed through instead of buffered (mitmproxy buffers by default).
STREAM_LARGE_BODIES = "512k"


def find_python(configured: Path | None) -> Path | None:
    """The proxy environment's Python: ``egress.python``, else ``.venv-egress`` next to the
    server's own virtual environment."""
    if configured is not None:
        return configured if configured.exists() else None
    sibling = Path(sys.prefix).parent / ".venv-egress" / "bin" / "python"
    return sibling if sibling.exists() else None


class ProxySupervisor:
    def __init__(
        self,
        *,
        python: Path,
        paths: EgressPaths,
        port: int,
        hosts_file: Path | None,
        intercept: str = "all",
        ready_timeout_s: float = 30,
    ) -> None:
        self.python = python
        self.paths = paths
        self.port = port
        self.hosts_file = hosts_file
        self.intercept = intercept
        self.ready_timeout_s = ready_timeout_s
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._watcher: asyncio.Task[None] | None = None
        self._stopping = False

    def argv(self) -> list[str]:
        opts = {
            "mode": f"regular@{self.port}",
            "confdir": str(self.paths.confdir),
            "listen_host": "0.0.0.0",  # nftables admits only sandboxes, each to its own address
            "ssl_verify_upstream_trusted_ca": str(self.paths.upstream_bundle),
            "stream_large_bodies": STREAM_LARGE_BODIES,
            "http3": "false",
            "termlog_verbosity": "warn",
            "shellbox_dir": str(self.paths.run),
            "shellbox_hosts_file": str(self.hosts_file or ""),
            "shellbox_intercept": self.intercept,
        }
        argv = ["setpriv", "--pdeathsig", "TERM", "--", str(self.python), "-I", str(PROXY_MAIN)]
        for key, value in opts.items():
            argv += ["--set", f"{key}={value}"]
        return argv

    async def start(self) -> None:
        """Start the proxy and return once it listens."""
        self._stopping = False
        await self._spawn()
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="shellbox-egress-proxy")

    async def _spawn(self) -> None:
        self.paths.ready.unlink(missing_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               "HOME": str(self.paths.confdir)}  # fmt: skip
        with open(self.paths.log, "ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,  # a ^C meant for the server goes through its shutdown
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                msg = f"the egress proxy exited at start-up; see {self.paths.log}"
                raise SandboxError(msg)
            with contextlib.suppress(OSError, ValueError):
                if int(self.paths.ready.read_text()) == self.proc.pid:
                    return
            await asyncio.sleep(0.02)
        await self._terminate()
        msg = f"the egress proxy did not start in {self.ready_timeout_s} s; see {self.paths.log}"
        raise SandboxError(msg)

    async def _watch(self) -> None:
        backoff = 0.2
        while not self._stopping:
            proc = self.proc
            if proc is None:
                return
            code = await proc.wait()
            if self._stopping:
                return
            log.error("the egress proxy exited (%s); restarting in %.1f s", code, backoff)
            await asyncio.sleep(backoff)
            try:
                await self._spawn()
                self.restarts += 1
                backoff = 0.2
            except Exception:
                log.exception("restarting the egress proxy failed")
                backoff = min(backoff * 2, 10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _terminate(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self._terminate()
        self.paths.ready.unlink(missing_ok=True)
