"""The agent's own buffers stay bounded when the host sends a large call and does not read."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from sandbox_helpers import TIME_SCALE, status_kb

from shellbox.sandbox import OciRuntime

MIB = 1 << 20


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def test_a_host_that_does_not_read_holds_the_agent_back_without_cost(
    runtime: OciRuntime, container: str
) -> None:
    agent = await runtime.agent_pid(container)
    assert agent is not None
    # Each command's result is ~790 kB of JSON (2 x 65 536 control characters, 6 bytes each
    # escaped); 20 of them, each command padded to 1 MiB: 20 MiB in, 16 MB out.
    one = "head -c 65536 /dev/zero | tr '\\0' '\\1'"
    noisy = f"{one}; {one} >&2; exit\n#"
    command = (noisy + "x" * (MIB - len(noisy))).encode()
    header = {
        "op": "exec",
        "command_bytes": [len(command)] * 20,
        "timeout_ms": 10_000,
        "max_output_length": 65_536,
        "env": {"PATH": "/usr/bin:/bin"},
        "stream": False,
    }
    hwm_before = status_kb(agent, "VmRSS")
    ticks_before = cpu_ticks(agent)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(runtime.socket_path(container)))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()

    async def send() -> None:
        await loop.sock_sendall(sock, json.dumps(header).encode() + b"\n")
        for _ in range(20):
            await loop.sock_sendall(sock, command)

    sender = asyncio.create_task(send())
    await asyncio.sleep(3)  # the host reads nothing meanwhile
    assert not sender.done()  # the agent stopped taking commands: the socket is full
    grown_kb = status_kb(agent, "VmRSS") - hwm_before
    spent = cpu_ticks(agent) - ticks_before
    assert grown_kb < 8 * 1024, grown_kb  # a command and ~1 MiB of queued results, not 20 MiB
    # Under 0.1 s of CPU in 3 s (times TIME_SCALE in an emulated guest): waiting, not polling.
    assert spent < 10 * TIME_SCALE, spent
    buf = bytearray()
    t = time.monotonic()
    while b'"done"' not in buf and time.monotonic() - t < 60:
        buf += await loop.sock_recv(sock, 1 << 20)
    await sender
    sock.close()
    results = [json.loads(line) for line in buf.splitlines() if b'"result"' in line[:20]]
    assert len(results) == 20
    assert {(len(r["stdout"]), len(r["stderr"])) for r in results} == {(65_536, 65_536)}
