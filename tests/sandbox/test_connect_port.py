"""``Runtime.connect_port``: a TCP connection to a service on the container's own loopback."""

from __future__ import annotations

import asyncio
import socket

import pytest
from anyio.abc import ByteStream
from sandbox_helpers import run1

from shellbox.errors import PortNotListening
from shellbox.sandbox import OciRuntime

# A one-connection-at-a-time echo server in the sandbox's python3, on its loopback only.
ECHO = (
    "import socket\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', {port})); s.listen()\n"
    "while True:\n"
    "    c, _ = s.accept()\n"
    "    while (b := c.recv(65536)):\n"
    "        c.sendall(b'echo:' + b)\n"
    "    c.close()\n"
)


async def start_echo(rt: OciRuntime, cid: str, port: int) -> None:
    result = await run1(
        rt,
        cid,
        f"cat > /tmp/echo.py <<'EOF'\n{ECHO.format(port=port)}EOF\n"
        "nohup python3 /tmp/echo.py >/dev/null 2>&1 &",
    )
    assert result.outcome.exit_code == 0, result


async def connect_when_up(rt: OciRuntime, cid: str, port: int) -> ByteStream:
    for _ in range(200):
        try:
            return await rt.connect_port(cid, port)
        except PortNotListening:
            await asyncio.sleep(0.05)
    raise AssertionError(f"the echo server on {port} never came up")


async def test_a_service_on_the_container_loopback_is_reached(
    runtime: OciRuntime, container: str
) -> None:
    await start_echo(runtime, container, 8000)
    stream = await connect_when_up(runtime, container, 8000)
    try:
        await stream.send(b"hello")
        assert await stream.receive() == b"echo:hello"
    finally:
        await stream.aclose()


async def test_nothing_listening_is_a_clear_error(runtime: OciRuntime, container: str) -> None:
    with pytest.raises(PortNotListening, match=r"nothing listens on 127\.0\.0\.1:8001"):
        await runtime.connect_port(container, 8001)


async def test_the_host_loopback_is_not_what_is_reached(
    runtime: OciRuntime, container: str
) -> None:
    """A server on the host's 127.0.0.1 is invisible: the socket lives in the sandbox's own
    network namespace, not the server's."""
    with socket.socket() as host_listener:
        host_listener.bind(("127.0.0.1", 0))
        host_listener.listen()
        port = host_listener.getsockname()[1]
        with pytest.raises(PortNotListening):
            await runtime.connect_port(container, port)


async def test_a_restarted_container_is_reached_in_its_new_namespace(
    runtime: OciRuntime, container: str
) -> None:
    await start_echo(runtime, container, 8002)
    await (await connect_when_up(runtime, container, 8002)).aclose()
    await runtime.stop(container)
    await runtime.start(container)
    with pytest.raises(PortNotListening):  # the old server died with the old namespace
        await runtime.connect_port(container, 8002)
    await start_echo(runtime, container, 8002)
    stream = await connect_when_up(runtime, container, 8002)
    try:
        await stream.send(b"again")
        assert await stream.receive() == b"echo:again"
    finally:
        await stream.aclose()
