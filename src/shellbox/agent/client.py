"""Host side of the agent protocol: one Unix-socket connection per request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from shellbox.agent import protocol
from shellbox.errors import AgentUnavailable, InvalidRequest, SandboxError
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

# The agent's error codes, and what each becomes on the host.
AGENT_CODE_TO_ERROR: dict[str, type[Exception]] = {
    "invalid_request": InvalidRequest,
    "request_too_large": InvalidRequest,
}


async def _connect(socket_path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_unix_connection(str(socket_path), limit=STREAM_LIMIT)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        msg = f"the sandbox agent is not reachable at {socket_path}: {exc.strerror}"
        raise AgentUnavailable(msg) from None


async def ping(socket_path: Path) -> dict[str, Any]:
    reader, writer = await _connect(socket_path)
    try:
        writer.write(b'{"op": "ping"}\n')
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
    if not line:
        msg = "the sandbox agent closed the connection without answering"
        raise AgentUnavailable(msg)
    answer: dict[str, Any] = json.loads(line)
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
        except (AgentUnavailable, ConnectionError, json.JSONDecodeError):
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


async def exec_stream(
    socket_path: Path, request: ExecRequest, *, base_env: dict[str, str]
) -> AsyncIterator[ExecEvent]:
    """Run a request and yield its events. Closing the generator early tells the agent to kill
    the running command (the agent treats a closed connection as an abandoned request)."""
    env = dict(base_env)
    if request.env:
        env.update(request.env)
    payload = {
        "op": "exec",
        "commands": request.commands,
        "timeout_ms": request.timeout_ms,
        "max_output_length": request.max_output_length,
        "env": env,
        "cwd": request.cwd or protocol.WORKDIR,
        "stream": request.stream,
    }
    reader, writer = await _connect(socket_path)
    try:
        writer.write(json.dumps(payload).encode() + b"\n")
        await writer.drain()
        while True:
            line = await reader.readline()
            if not line:
                msg = "the sandbox agent closed the connection in the middle of a call"
                raise AgentUnavailable(msg)
            msg_obj: dict[str, Any] = json.loads(line)
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
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, BrokenPipeError):
            pass
