"""Host side of a terminal (``op: pty``, see ``protocol``): one Unix-socket connection per
terminal, framed both ways once the agent has answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from shellbox.agent import protocol
from shellbox.agent.client import AGENT_CODE_TO_ERROR, connect
from shellbox.errors import AgentUnavailable, SandboxError
from shellbox.sandbox.base import PtyRequest

# The stream's own buffer: it stops reading the socket past twice this, so a host that reads
# slowly holds the agent (and the shell) back instead of growing.
READ_LIMIT = protocol.PTY_OUTBUF_BYTES


class AgentPty:
    """An open terminal (``shellbox.sandbox.base.PtySession``)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._send_lock = asyncio.Lock()  # one frame at a time: write and resize interleave
        self._exit_code: int | None = None
        self._read = False

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    async def output(self) -> AsyncIterator[bytes]:
        if self._read:
            msg = "a terminal's output can be read once"
            raise RuntimeError(msg)
        self._read = True
        reader = self._reader
        while True:
            try:
                head = await reader.readexactly(protocol.PTY_FRAME_HEADER)
                kind, size = head[:1], int.from_bytes(head[1:], "big")
                if size > protocol.MAX_PTY_FRAME:
                    msg = f"the sandbox agent sent a terminal frame of {size} bytes"
                    raise AgentUnavailable(msg)
                payload = await reader.readexactly(size)
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the agent went away (container paused, stopped or removed)
            if kind == protocol.PTY_DATA:
                yield payload
            elif kind == protocol.PTY_EXIT:
                self._exit_code = int.from_bytes(payload, "big", signed=True)
                return

    async def _send(self, frame: bytes) -> None:
        async with self._send_lock:
            if self._writer.is_closing():
                return
            try:
                self._writer.write(frame)
                await self._writer.drain()
            except ConnectionError:
                return  # the output side sees the end

    async def write(self, data: bytes) -> None:
        step = protocol.MAX_PTY_FRAME
        for start in range(0, len(data), step):
            await self._send(protocol.pty_frame(protocol.PTY_DATA, data[start : start + step]))

    async def resize(self, cols: int, rows: int) -> None:
        payload = cols.to_bytes(2, "big") + rows.to_bytes(2, "big")
        await self._send(protocol.pty_frame(protocol.PTY_RESIZE, payload))

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


async def open_pty(
    socket_path: Path, request: PtyRequest, *, base_env: Mapping[str, str]
) -> AgentPty:
    """Start a terminal; raises the agent's refusal (``AGENT_CODE_TO_ERROR``) as it is."""
    env = {**base_env, "TERM": "xterm-256color", **(request.env or {})}
    header = {
        "op": "pty",
        "cols": request.cols,
        "rows": request.rows,
        "command": request.command,
        "env": env,
        "cwd": request.cwd or protocol.WORKDIR,
    }
    reader, writer = await connect(socket_path, limit=READ_LIMIT)
    try:
        writer.write(json.dumps(header).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
    except (ConnectionError, OSError) as exc:
        writer.close()
        msg = f"the sandbox agent at {socket_path} failed: {exc}"
        raise AgentUnavailable(msg) from None
    answer: dict[str, Any] = json.loads(line) if line.strip() else {}
    if answer.get("type") != "started":
        writer.close()
        if not answer:
            msg = "the sandbox agent closed the connection without answering"
            raise AgentUnavailable(msg)
        error_cls = AGENT_CODE_TO_ERROR.get(str(answer.get("code", "")), SandboxError)
        raise error_cls(str(answer.get("message")))
    return AgentPty(reader, writer)
