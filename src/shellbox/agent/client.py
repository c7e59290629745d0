"""Host side of the agent protocol: one Unix-socket connection per request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from shellbox.agent import protocol
from shellbox.errors import (
    AgentNotReachable,
    AgentOutdated,
    AgentUnavailable,
    ContainerBusy,
    InvalidRequest,
    SandboxError,
)
from shellbox.sandbox.base import (
    CommandFinished,
    CommandResult,
    CommandStarted,
    ExecEvent,
    ExecRequest,
    Outcome,
    OutputDelta,
)

STREAM_LIMIT = 64 * 1024 * 1024  # one line can carry two capped streams, JSON-escaped
READ_SIZE = 256 * 1024

# The agent's error codes, and what each becomes on the host.
AGENT_CODE_TO_ERROR: dict[str, type[Exception]] = {
    "invalid_request": InvalidRequest,
    "request_too_large": InvalidRequest,
    "busy": ContainerBusy,
}


async def connect(
    socket_path: Path, *, limit: int = STREAM_LIMIT
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_unix_connection(str(socket_path), limit=limit)
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
        msg = f"the sandbox agent is not reachable at {socket_path}: {exc.strerror}"
        raise AgentNotReachable(msg) from None


async def _connect_raw(socket_path: Path) -> socket.socket:
    """A connected non-blocking socket: cheaper per call than asyncio's streams."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, str(socket_path))
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
        sock.close()
        msg = f"the sandbox agent is not reachable at {socket_path}: {exc.strerror}"
        raise AgentNotReachable(msg) from None
    except BaseException:
        sock.close()
        raise
    return sock


async def ping(socket_path: Path) -> dict[str, Any]:
    """Ask the agent for a sign of life. Raises ``AgentUnavailable`` if it cannot answer, and
    ``AgentOutdated`` if it speaks another protocol version than ``protocol.PROTOCOL_VERSION``
    (every agent since the first answers ``ping`` with its version): such an agent answers
    every call with an error, so whoever adopts a running container must start it again.

    The host binds the socket before the agent starts, so right after a start this waits
    (without polling) until the agent is up and takes the request from the backlog."""
    reader, writer = await connect(socket_path)
    try:
        writer.write(b'{"op": "ping"}\n')
        await writer.drain()
        line = await reader.readline()
    except (ConnectionError, OSError) as exc:
        msg = f"the sandbox agent at {socket_path} failed: {exc}"
        raise AgentUnavailable(msg) from None
    finally:
        writer.close()
    if not line:
        msg = "the sandbox agent closed the connection without answering"
        raise AgentUnavailable(msg)
    answer: dict[str, Any] = json.loads(line)
    version = answer.get("version") if isinstance(answer, dict) else None
    if version != protocol.PROTOCOL_VERSION:
        msg = (
            f"the sandbox agent at {socket_path} speaks protocol {version!r}, "
            f"not {protocol.PROTOCOL_VERSION}"
        )
        raise AgentOutdated(msg)
    return answer


async def wait_ready(socket_path: Path, timeout_s: float = 10.0) -> None:
    """Wait until the agent accepts connections (it binds the socket once it is ready)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    delay = 0.0005
    while True:
        try:
            await ping(socket_path)
            return
        except (AgentUnavailable, OSError, json.JSONDecodeError):
            if loop.time() > deadline:
                msg = f"the sandbox agent did not start within {timeout_s:.0f} s"
                raise AgentUnavailable(msg) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.01)


def _decode(msg: dict[str, Any]) -> ExecEvent | None:
    kind = msg.get("type")
    if kind == "delta":
        return OutputDelta(msg["command_index"], msg["stream"], msg["text"])
    if kind == "started":
        return CommandStarted(msg["command_index"])
    if kind == "result":
        o = msg["outcome"]
        outcome = Outcome("timeout") if o["type"] == "timeout" else Outcome("exit", o["exit_code"])
        return CommandFinished(
            msg["command_index"], CommandResult(msg["stdout"], msg["stderr"], outcome)
        )
    return None


def _command_bytes(command: str) -> int:
    """The size of a command on the wire, without encoding an ASCII one to find out."""
    return len(command) if command.isascii() else len(command.encode("utf-8", "surrogatepass"))


async def _send_request(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, header: bytes, commands: list[str]
) -> None:
    """Write the header, then each command's bytes. The agent reads a command only when it is
    about to start it, so this waits on the socket meanwhile and holds one command's bytes at
    a time, never the whole call. A failed write ends the sending quietly: what the agent
    said (an error line) or its closing is read by the receiving side."""
    try:
        await loop.sock_sendall(sock, header)
        for command in commands:
            await loop.sock_sendall(sock, command.encode("utf-8", "surrogatepass"))
    except OSError:
        return


async def exec_stream(
    socket_path: Path, request: ExecRequest, *, base_env: dict[str, str]
) -> AsyncIterator[ExecEvent]:
    """Run a request and yield its events. Closing the generator early tells the agent to kill
    the running command (the agent treats a closed connection as an abandoned request)."""
    env = dict(base_env)
    if request.env:
        env.update(request.env)
    header = {
        "op": "exec",
        "command_bytes": [_command_bytes(c) for c in request.commands],
        "timeout_ms": request.timeout_ms,
        "max_output_length": request.max_output_length,
        "env": env,
        "cwd": request.cwd or protocol.WORKDIR,
        "stream": request.stream,
    }
    loop = asyncio.get_running_loop()
    sock = await _connect_raw(socket_path)
    sender: asyncio.Task[None] | None = None
    try:
        sender = loop.create_task(
            _send_request(loop, sock, json.dumps(header).encode() + b"\n", request.commands)
        )
        buf = bytearray()
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > STREAM_LIMIT:
                    msg = "the sandbox agent sent a line longer than the client accepts"
                    raise AgentUnavailable(msg)
                try:
                    data = await loop.sock_recv(sock, READ_SIZE)
                except OSError as exc:
                    msg = f"the sandbox agent at {socket_path} failed: {exc}"
                    raise AgentUnavailable(msg) from None
                if not data:
                    msg = "the sandbox agent closed the connection in the middle of a call"
                    raise AgentUnavailable(msg)
                buf += data
                continue
            msg_obj: dict[str, Any] = json.loads(buf[:nl])
            del buf[: nl + 1]
            kind = msg_obj.get("type")
            if kind == "done":
                return
            if kind == "error":
                error_cls = AGENT_CODE_TO_ERROR.get(msg_obj.get("code", ""), SandboxError)
                raise error_cls(str(msg_obj.get("message")))
            event = _decode(msg_obj)
            if event is not None:
                yield event
    finally:
        if sender is not None and not sender.done():
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        sock.close()
