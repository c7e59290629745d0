"""A connected TCP socket as an anyio ``ByteStream`` that reads only when asked.

anyio's ``SocketStream.from_socket`` leaves the socket's transport reading until the first
``receive``, into a queue with no bound: a service in a sandbox that writes before the
server reads (or while it is still sending a request) would grow the server's memory for as
long as it likes. This stream holds no buffer of its own: ``receive`` is one ``recv`` of at
most ``max_bytes``, ``send`` returns once the kernel took every byte, so the socket buffers
are all there is between the two ends and TCP's window holds back whichever writes faster.

``aclose`` shuts the socket down first and waits for a ``receive`` or ``send`` still pending
in another task to see it: the event loop watches the socket's descriptor while one is, and
closing it under them would leave the loop watching a number the next socket may reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import anyio
from anyio.abc import ByteStream

CLOSE_WAIT_S = 1.0  # how long ``aclose`` waits for pending calls to see the shutdown


class SocketByteStream(ByteStream):
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._closed = False
        self._eof = False
        self._pending = 0  # receive/send calls waiting on the socket
        self._idle = anyio.Event()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            msg = "max_bytes must be a positive integer"
            raise ValueError(msg)
        if self._closed:
            raise anyio.ClosedResourceError
        self._pending += 1
        try:
            data = await asyncio.get_running_loop().sock_recv(self._sock, max_bytes)
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from None
            raise anyio.BrokenResourceError from exc
        finally:
            self._done()
        if not data:
            if self._closed:
                raise anyio.ClosedResourceError
            raise anyio.EndOfStream
        return data

    def _done(self) -> None:
        self._pending -= 1
        if self._pending == 0 and self._closed:
            self._idle.set()

    async def send(self, item: bytes) -> None:
        if self._closed or self._eof:
            raise anyio.ClosedResourceError
        self._pending += 1
        try:
            await asyncio.get_running_loop().sock_sendall(self._sock, item)
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from None
            raise anyio.BrokenResourceError from exc
        finally:
            self._done()

    async def send_eof(self) -> None:
        self._eof = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    async def aclose(self) -> None:
        if self._closed:
            await anyio.lowlevel.checkpoint()
            return
        self._closed = True
        if self._pending:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes them
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_WAIT_S):
                await self._idle.wait()
        self._sock.close()
        await anyio.lowlevel.checkpoint()
