"""The byte streams of a ``RemoteRuntime``: ``connect_port``'s connection and ``pty``'s
terminal, each one WebSocket to the node (``GET /v1/runtime/<method>``, ``shellbox.node``).

Why a WebSocket: the node is an ASGI application under uvicorn, which upgrades a connection
to a WebSocket and to nothing else, and httpx sends a request's whole body before it reads
the answer, so a plain HTTP exchange is not full duplex. A WebSocket is, over one TCP
connection, and its messages frame the few control messages a stream needs beside its bytes.

The exchange: the arguments go in the ``shellbox-args`` header and the cluster key in
``Authorization``, as for the other methods. The node does the call *before* it accepts the
socket, so a refusal (``PortNotListening``, ``ContainerNotFound``, a bad key) is an HTTP
answer with the usual error body and crosses as its class before any byte of the stream.
Once open, binary messages are the stream's bytes both ways; text messages are JSON control
messages: ``{"type": "eof"}`` (that side will send no more: ``send_eof``, or the service's
own end), ``{"type": "resize", "cols": N, "rows": N}`` (to a terminal) and ``{"type":
"exit", "exit_code": N}`` (a terminal's shell ended; the node closes the socket next). A
close with 1000 is an orderly end; any other (1011: the service reset its connection) is a
broken stream.

Back-pressure holds both ways with no unbounded buffer: a side reads the socket only as
fast as what it feeds takes the bytes (the node's uvicorn reads the next message once the
relay has taken the last, this client pauses the connection past ``MAX_QUEUE`` frames), so
TCP's window stops the writer. For the same reason neither side sends keepalive pings (a
peer that does not read would miss them and be cut off for being slow): the socket's TCP
keepalive finds a peer that is gone instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from anyio.abc import ByteStream
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake

from shellbox.errors import ShellboxError

CHUNK = 65536  # the largest binary message either side sends
MAX_MESSAGE = 1 << 20  # what either side accepts (a control message, a chunk)
MAX_QUEUE = 16  # frames received and not yet read, before the connection is paused
EOF = json.dumps({"type": "eof"})
CLOSE_TIMEOUT_S = 2.0  # an ``aclose`` waits this long for the node's close, then drops it
BROKEN = 1011  # the close code of a stream that broke (a reset, the node's failure)


def keepalive(sock: socket.socket, idle_s: int = 30, interval_s: int = 10, count: int = 3) -> None:
    """TCP keepalive on ``sock``: a peer that vanished (its machine down, the network cut) is
    found within about ``idle_s + interval_s * count`` of silence."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)


async def dial(host: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to the node within ``timeout_s`` (``TimeoutError`` or ``OSError``)."""
    loop = asyncio.get_running_loop()
    with anyio.fail_after(timeout_s):
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        failure: OSError = OSError(f"no address for {host}")
        for family, kind, proto, _, address in infos:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, address)
            except OSError as exc:
                sock.close()
                failure = exc
                continue
            except BaseException:
                sock.close()
                raise
            keepalive(sock)
            return sock
        raise failure


async def open_websocket(
    url: str,
    sock: socket.socket,
    headers: Mapping[str, str],
    *,
    open_timeout_s: float,
    refused: Callable[[int, bytes], ShellboxError],
    tls: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> ClientConnection:
    """The WebSocket handshake over ``sock`` (TLS first with ``tls``: a ``wss://`` url); a
    node's refusal raised as ``refused`` says, an answer that is not HTTP (the node went away
    mid-handshake) as a ``ConnectionError``."""
    try:
        return await connect(
            url,
            sock=sock,
            ssl=tls,
            server_hostname=server_hostname if tls else None,
            additional_headers=dict(headers),
            open_timeout=open_timeout_s,
            ping_interval=None,
            compression=None,
            max_size=MAX_MESSAGE,
            max_queue=MAX_QUEUE,
            write_limit=CHUNK,
            close_timeout=CLOSE_TIMEOUT_S,
        )
    except InvalidHandshake as exc:
        sock.close()
        response = getattr(exc, "response", None)
        if response is None:
            raise ConnectionError(str(exc)) from None
        raise refused(int(response.status_code), bytes(response.body or b"")) from None
    except BaseException:
        sock.close()
        raise


def _control(text: str) -> dict[str, Any]:
    try:
        raw = json.loads(text)
    except ValueError:
        raw = None
    return raw if isinstance(raw, dict) else {}


class RemoteByteStream(ByteStream):
    """A connection to a service in a container on a node, with a local ``SocketStream``'s
    semantics: ``receive`` ends with ``EndOfStream`` when the service stops sending, raises
    ``BrokenResourceError`` when its connection broke and ``ClosedResourceError`` after
    ``aclose``; ``send_eof`` half-closes (the service reads its end, and may still answer)."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._pending = b""  # the rest of a message longer than a ``receive`` asked for
        self._at_eof = False
        self._eof_sent = False
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            msg = "max_bytes must be a positive integer"
            raise ValueError(msg)
        if self._closed:
            raise anyio.ClosedResourceError
        while not self._pending:
            if self._at_eof:
                raise anyio.EndOfStream
            try:
                message = await self._ws.recv()
            except ConnectionClosedOK:
                self._at_eof = True
                continue
            except ConnectionClosed:
                if self._closed:
                    raise anyio.ClosedResourceError from None
                raise anyio.BrokenResourceError from None
            if isinstance(message, bytes):
                self._pending = message
            elif _control(message).get("type") == "eof":
                self._at_eof = True
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._eof_sent:  # a local socket's write after its write_eof fails too
            raise anyio.ClosedResourceError
        try:
            for start in range(0, len(item), CHUNK):
                await self._ws.send(item[start : start + CHUNK])
        except ConnectionClosed:
            raise anyio.BrokenResourceError from None

    async def send_eof(self) -> None:
        if self._closed or self._eof_sent:
            return
        self._eof_sent = True
        with contextlib.suppress(ConnectionClosed):  # as a local socket's: the reader sees it
            await self._ws.send(EOF)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._ws.close()


class RemotePty:
    """A terminal on a node (``shellbox.sandbox.base.PtySession``)."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
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
        while True:
            try:
                message = await self._ws.recv()
            except ConnectionClosed:
                return  # the terminal ended otherwise (its container went, ``close``)
            if isinstance(message, bytes):
                yield message
                continue
            control = _control(message)
            if control.get("type") == "exit":
                code = control.get("exit_code")
                self._exit_code = code if type(code) is int else None
                return

    async def _send(self, message: bytes | str) -> None:
        try:
            await self._ws.send(message)
        except ConnectionClosed:
            return  # the output side sees the end

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), CHUNK):
            await self._send(data[start : start + CHUNK])

    async def resize(self, cols: int, rows: int) -> None:
        await self._send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def close(self) -> None:
        await self._ws.close()
