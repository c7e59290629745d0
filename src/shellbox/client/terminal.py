"""Terminals (``GET /v1/containers/{id}/pty``) for both clients: a WebSocket whose binary
messages are the terminal's bytes and whose text messages are JSON control messages.

    with sb.pty(container_id, cols=120, rows=40) as term:     # AsyncShellbox: async with
        term.send("ls\\n")
        for chunk in term: ...                                 # bytes until the shell exits
    term.exit_code                                             # None: ended otherwise

Needs the ``websockets`` package (a dependency of shellbox's server).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx

from shellbox.client import wire
from shellbox.client.errors import APIConnectionError, StreamError, status_error

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection as AsyncConnection
    from websockets.sync.client import ClientConnection as SyncConnection


def pty_url(base_url: str, container_id: str, cols: int, rows: int, command: str | None) -> str:
    """The route's ws:// (or wss://) URL under the client's ``base_url``."""
    url = base_url
    if url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    params: dict[str, Any] = {"cols": cols, "rows": rows}
    if command is not None:
        params["command"] = command
    return f"{url}{wire.container_path(container_id, 'pty')}?{urlencode(params)}"


def resize_message(cols: int, rows: int) -> str:
    return json.dumps({"type": "resize", "cols": cols, "rows": rows})


def as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def refusal(exc: Exception) -> Exception:
    """The client's error for a failed WebSocket handshake: the server's HTTP error (with its
    envelope) as the matching ``APIStatusError``, anything else as a connection error."""
    from websockets.exceptions import InvalidStatus

    if isinstance(exc, InvalidStatus):
        r = exc.response
        response = httpx.Response(r.status_code, headers=list(r.headers.raw_items()))
        return status_error(response, bytes(r.body or b""))
    return APIConnectionError(f"Connection error (terminal): {exc}")


class _Ending:
    """What the server said about the end: the exit status, or why it closed."""

    def __init__(self) -> None:
        self.exit_code: int | None = None

    def control(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            return
        if isinstance(msg, dict) and msg.get("type") == "exit":
            code = msg.get("exit_code")
            self.exit_code = code if isinstance(code, int) else None

    def check_close(self, code: int | None, reason: str) -> None:
        """A close other than after an exit is an error the caller should see."""
        if self.exit_code is None and code not in (1000, None):
            msg = f"the terminal was closed ({code}): {reason or 'no reason given'}"
            raise StreamError(msg, code=str(code))


class AsyncTerminal:
    """An open terminal: iterate it for output bytes; ``send``, ``resize``, ``exit_code``."""

    def __init__(self, ws: AsyncConnection) -> None:
        self._ws = ws
        self._ending = _Ending()

    @property
    def exit_code(self) -> int | None:
        """The shell's exit status once the output has ended with it; None before, or when
        the terminal ended otherwise."""
        return self._ending.exit_code

    async def send(self, data: bytes | str) -> None:
        await self._ws.send(as_bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send(resize_message(cols, rows))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self._ws:
                if isinstance(message, str):
                    self._ending.control(message)
                else:
                    yield message
        except ConnectionClosed:
            pass
        self._ending.check_close(self._ws.close_code, self._ws.close_reason or "")

    async def close(self) -> None:
        await self._ws.close()


class Terminal:
    """The blocking twin of ``AsyncTerminal``."""

    def __init__(self, ws: SyncConnection) -> None:
        self._ws = ws
        self._ending = _Ending()

    @property
    def exit_code(self) -> int | None:
        return self._ending.exit_code

    def send(self, data: bytes | str) -> None:
        self._ws.send(as_bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send(resize_message(cols, rows))

    def recv(self, timeout: float | None = None) -> bytes | None:
        """The next output bytes; None once the terminal has ended. ``TimeoutError`` when
        nothing came within ``timeout`` seconds."""
        from websockets.exceptions import ConnectionClosed

        while True:
            try:
                message = self._ws.recv(timeout=timeout)
            except ConnectionClosed:
                self._ending.check_close(self._ws.close_code, self._ws.close_reason or "")
                return None
            if isinstance(message, str):
                self._ending.control(message)
            else:
                return message

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.recv()
            if chunk is None:
                return
            yield chunk

    def close(self) -> None:
        self._ws.close()
