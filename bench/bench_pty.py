"""Benchmark: a terminal's keystroke-to-echo latency, and its output throughput.

Against a real ``shellbox serve`` subprocess on loopback, in one container:

* keystroke-to-echo: one character sent, the time until bash (readline) has echoed it back,
  one at a time (Ctrl-U clears the line every 50). Through the WebSocket route
  (``GET /v1/containers/{id}/pty``: client -> uvicorn -> agent socket -> terminal and back),
  and, as the floor it is measured against, straight through the agent's socket from this
  process (the same agent, terminal and bash; no server, no WebSocket);
* throughput: a 10 MiB file ``cat`` to the terminal, through the WebSocket, read as fast as
  it comes (a program that writes line by line, as ``seq`` does on a terminal, is held to the
  terminal's own pace instead: about 1 MB/s here, ``script`` alone in the container too).

Goal (issue 17): keystroke-to-echo p50 <= 5 ms over loopback.

Run: ``.venv/bin/python bench/bench_pty.py [--keys N]``. Prints a table and writes
``bench/results/pty.json``. Needs root and the sandbox image, like the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
from websockets.asyncio.client import connect

from bench_server import stop_server, wait_healthy
from shellbox.agent import pty_client
from shellbox.sandbox import OciRuntime, PtyRequest, hostns
from shellbox.sandbox.image import image_for

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
RESULTS = Path(__file__).resolve().parent / "results" / "pty.json"
GOAL_MS = 5.0
OUTPUT_LINES = 655_360  # of 16 bytes: 10 MiB


class Server:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shellbox-bench-pty-", dir="/var/tmp"))
        self.dir.chmod(0o711)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "SHELLBOX_RUNTIME__IMAGE_DIR": str(IMAGE_DIR)}
        self.log_path = self.dir / "server.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        cli = [sys.executable, "-m", "shellbox.cli"]
        self.proc = subprocess.Popen(
            [*cli, "serve", "--state-dir", str(self.dir), "--port", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_healthy(self.url, self.proc, self.log_path)
        self.runtime = OciRuntime(self.dir, image_for(IMAGE_DIR, "default").path)

    def stop(self) -> None:
        stop_server(self.proc, self.log)
        for info in asyncio.run(self.runtime.list()):
            asyncio.run(self.runtime.destroy(info.id))
        hostns.detach(str(self.dir / "disks"))  # mounted in this process by the runtime
        shutil.rmtree(self.dir, ignore_errors=True)


Send = Callable[[bytes], Awaitable[None]]


async def echo_times(send: Send, output: AsyncIterator[bytes], keys: int) -> list[float]:
    """Seconds from each keystroke to its echo."""
    seen = b""

    async def until(want: bytes) -> None:
        nonlocal seen
        while want not in seen:
            seen += await asyncio.wait_for(anext(output), 30)
        seen = b""

    await send(b"echo =re''ady\n")
    await until(b"=ready\r\n")
    await asyncio.sleep(0.3)  # the prompt has been printed
    seen = b""
    times: list[float] = []
    for i in range(keys):
        t0 = time.perf_counter()
        await send(b"a")
        await until(b"a")
        times.append(time.perf_counter() - t0)
        if i % 50 == 49:
            await send(b"\x15")  # Ctrl-U: clear the line
            await asyncio.sleep(0.05)
            seen = b""
    return times


async def over_websocket(url: str, keys: int) -> tuple[list[float], float]:
    """Echo times through the route, then seconds to read 10 MiB of output."""
    headers = {"authorization": "Bearer bench"}
    async with connect(url, additional_headers=headers, max_size=None) as ws:

        async def output() -> AsyncIterator[bytes]:
            async for message in ws:
                if isinstance(message, bytes):
                    yield message

        stream = output()
        times = await echo_times(ws.send, stream, keys)
        await ws.send(
            f"\x15stty -echo; seq -f '%015g' 1 {OUTPUT_LINES} >/tmp/n; echo =g''o\n".encode()
        )
        seen = b""
        while b"=go\r\n" not in seen:
            seen += await anext(stream)
        t0 = time.perf_counter()
        await ws.send(b"cat /tmp/n; echo =e''nd\n")
        got = 0
        tail = b""
        while b"=end" not in tail:
            chunk = await anext(stream)
            got += len(chunk)
            tail = tail[-8:] + chunk
        elapsed = time.perf_counter() - t0
        if got < OUTPUT_LINES * 16:
            raise SystemExit(f"only {got} bytes of output arrived")
    return times, elapsed


async def over_agent_socket(runtime: OciRuntime, cid: str, keys: int) -> list[float]:
    term = await pty_client.open_pty(
        runtime.socket_path(cid), PtyRequest(cols=80, rows=24), base_env=runtime.base_env
    )
    try:
        return await echo_times(term.write, term.output(), keys)
    finally:
        await term.close()


def ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=500)
    args = parser.parse_args()
    srv = Server()
    try:
        auth = {"authorization": "Bearer bench"}  # no keys exist: any key, on loopback
        with httpx.Client(base_url=srv.url, headers=auth, timeout=120) as http:
            cid = http.post("/v1/containers", json={"name": "bench-pty"}).json()["id"]
        url = f"ws://127.0.0.1:{srv.port}/v1/containers/{cid}/pty?cols=80&rows=24"
        # Interleaved halves, so the machine's load falls on both paths alike.
        ws_times: list[float] = []
        agent_times: list[float] = []
        seconds: list[float] = []
        for _ in range(2):
            agent_times += asyncio.run(over_agent_socket(srv.runtime, cid, args.keys // 2))
            times, elapsed = asyncio.run(over_websocket(url, args.keys // 2))
            ws_times += times
            seconds.append(elapsed)
    finally:
        srv.stop()
    rows = {
        "agent socket (floor)": agent_times,
        "WebSocket route": ws_times,
    }
    results = {
        name: {
            "p50_ms": ms(t, 0.5),
            "p90_ms": ms(t, 0.9),
            "p99_ms": ms(t, 0.99),
            "keys": len(t),
        }
        for name, t in rows.items()
    }
    p50_ws = results["WebSocket route"]["p50_ms"]
    p50_floor = results["agent socket (floor)"]["p50_ms"]
    mib_s = round(OUTPUT_LINES * 16 / (1 << 20) / statistics.median(seconds), 1)
    print(f"{'keystroke to echo':<22} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'keys':>6}")
    for name, row in results.items():
        print(
            f"{name:<22} {row['p50_ms']:>8} {row['p90_ms']:>8} {row['p99_ms']:>8} {row['keys']:>6}"
        )
    ratio = round(p50_ws / p50_floor, 2) if p50_floor else None
    print(
        f"route / floor p50: {ratio}x (+{round(p50_ws - p50_floor, 3)} ms); goal p50 <= "
        f"{GOAL_MS} ms: {'met' if p50_ws <= GOAL_MS else 'NOT met'}"
    )
    print(f"output through the WebSocket: {mib_s} MiB/s (10 MiB, median of {len(seconds)})")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "kernel": platform.release(),
                "keystroke_to_echo": results,
                "route_over_floor_p50": ratio,
                "goal_p50_ms": GOAL_MS,
                "output_mib_per_s": mib_s,
            },
            indent=2,
        )
    )
    print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()
