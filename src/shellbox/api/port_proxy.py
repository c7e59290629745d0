"""Relaying one HTTP exchange or one WebSocket between a client and a service in a container.

HTTP: the request goes to the service as HTTP/1.1 over a fresh connection (``h11``), its body
streamed chunk by chunk as the client sends it; the answer's head is read (bounded by h11's
16 KiB head limit and ``ports.head_timeout_s``), then its body is streamed to the client as
the service writes it. Nothing holds a whole body. Hop-by-hop headers are dropped both ways,
and the client's ``Authorization`` header (the project's key) never reaches the sandbox.

WebSocket: the server accepts the client's socket once the service has accepted its own
(``websockets``' sans-I/O client protocol over the connection), with the subprotocol the
service chose, then relays messages both ways until either side closes; control frames are
answered by each side's own protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import h11
from anyio.abc import ByteStream
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, ProtocolError
from websockets.frames import Frame, Opcode
from websockets.http11 import Response as WsResponse
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from shellbox.errors import PortNotListening

log = logging.getLogger("shellbox.ports")

READ_BYTES = 65536
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"authorization", b"content-length"}
WS_NOT_FORWARDED = NOT_FORWARDED | {
    b"origin",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
    b"sec-websocket-accept",
}


def service_path(raw_path: bytes, depth: int) -> str:
    """What follows a port route's own ``depth`` path segments, as the client sent it."""
    parts = raw_path.split(b"/", depth + 1)
    rest = parts[depth + 1] if len(parts) > depth + 1 else b""
    return "/" + rest.decode("latin-1")


def _broken(port: int, what: str) -> PortNotListening:
    return PortNotListening(f"the service on port {port} {what}", param="port")


def forwarded_headers(
    request_headers: Iterable[tuple[bytes, bytes]],
    scope: Scope,
    port: int,
    prefix: str,
    skip: frozenset[bytes],
) -> list[tuple[bytes, bytes]]:
    """The client's headers for the service: hop-by-hop ones and the key left out, ``Host``
    the service's own, and the usual ``X-Forwarded-*`` saying where the client came from and
    under which path prefix the service is seen."""
    host = b""
    out: list[tuple[bytes, bytes]] = [(b"host", f"127.0.0.1:{port}".encode())]
    for name, value in request_headers:
        if name == b"host":
            host = value
        if name not in skip and not name.startswith(b"x-forwarded-"):
            out.append((name, value))
    client = scope.get("client")
    if client:
        out.append((b"x-forwarded-for", str(client[0]).encode()))
    if host:
        out.append((b"x-forwarded-host", host))
    scheme = b"https" if scope.get("scheme") in ("https", "wss") else b"http"
    out.append((b"x-forwarded-proto", scheme))
    out.append((b"x-forwarded-prefix", prefix.encode()))
    return out


class _Upstream:
    """One HTTP/1.1 exchange with the service, over ``stream``."""

    def __init__(self, stream: ByteStream, port: int) -> None:
        self.stream = stream
        self.port = port
        self.conn = h11.Connection(h11.CLIENT)

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            try:
                await self.stream.send(data)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                raise _broken(self.port, "closed the connection during the request") from None

    def buffered_event(self) -> h11.Event | type[h11.NEED_DATA]:
        """The next event if what was received holds it, else ``h11.NEED_DATA``."""
        try:
            event = self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            raise _broken(self.port, f"sent a malformed answer: {exc}") from None
        assert event is h11.NEED_DATA or isinstance(event, h11.Event)
        return event

    async def next_event(self) -> h11.Event:
        while True:
            event = self.buffered_event()
            if event is not h11.NEED_DATA:
                assert isinstance(event, h11.Event)
                return event
            try:
                data = await self.stream.receive(READ_BYTES)
            except anyio.EndOfStream:
                data = b""
            except (anyio.BrokenResourceError, OSError):
                raise _broken(self.port, "reset the connection") from None
            self.conn.receive_data(data)


def answer_headers(
    headers: Iterable[tuple[bytes, bytes]], prefix: str
) -> list[tuple[bytes, bytes]]:
    """The service's answer headers for the client. The server's origin is shared by every
    container's services and the console, so a cookie the service sets is kept to the
    service's own path prefix (its ``Path`` and ``Domain`` replaced), and a redirect to one
    of the service's absolute paths (``Location: /login``) stays under the prefix."""
    out = []
    root = prefix.encode()
    for name, value in headers:
        if name in HOP_BY_HOP:
            continue
        if name == b"set-cookie":
            kept = [
                part
                for part in value.split(b";")
                if not part.strip().lower().startswith((b"path=", b"domain="))
            ]
            value = b";".join(kept) + b"; Path=" + root + b"/"
        elif name == b"location" and value.startswith(b"/") and not value.startswith(b"//"):
            value = root + value
        out.append((name, value))
    return out


class ProxiedResponse(Response):
    """The service's answer, streamed; closes the connection (and ends the container's
    activity) when done, whether the client read it all or went away."""

    def __init__(
        self,
        head: h11.Response,
        upstream: _Upstream,
        cleanup: AsyncExitStack,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.status_code = head.status_code
        self.upstream = upstream
        self.cleanup = cleanup
        self.background = None
        self.raw_headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.cleanup:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            event: h11.Event | type[h11.NEED_DATA] = await self.upstream.next_event()
            while isinstance(event, h11.Data):
                chunk = bytes(event.data)
                # What the service sent already may hold the answer's end: then the last chunk
                # goes out as such, one message fewer through every layer (a small answer is
                # one chunk). Nothing is held back waiting for more.
                event = self.upstream.buffered_event()
                last = isinstance(event, h11.EndOfMessage | h11.ConnectionClosed)
                await send({"type": "http.response.body", "body": chunk, "more_body": not last})
                if last:
                    return
                if not isinstance(event, h11.Event):  # NEED_DATA
                    event = await self.upstream.next_event()
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def forward_http(
    request: Request,
    stream: ByteStream,
    cleanup: AsyncExitStack,
    *,
    port: int,
    path: str,
    prefix: str,
    head_timeout_s: float,
    extra_headers: Iterable[tuple[bytes, bytes]] = (),
) -> Response:
    """Send the request to the service and answer with its response, streamed. ``cleanup``
    (which holds ``stream``) is the response's to close from here on."""
    upstream = _Upstream(stream, port)
    headers = forwarded_headers(request.headers.raw, request.scope, port, prefix, NOT_FORWARDED)
    length = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "").lower()
    if length is not None and length.isdigit():
        headers.append((b"content-length", length.encode()))
    elif chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"connection", b"close"))
    query = request.scope.get("query_string", b"")
    target = path.encode() + (b"?" + query if query else b"")
    try:
        await upstream.send(h11.Request(method=request.method, target=target, headers=headers))
        if length is not None or chunked:
            async for chunk in request.stream():
                if chunk:
                    await upstream.send(h11.Data(data=chunk))
        await upstream.send(h11.EndOfMessage())
        async with asyncio.timeout(head_timeout_s):  # anyio's fail_after costs 3x as much
            while True:
                event = await upstream.next_event()
                if isinstance(event, h11.Response):
                    break
                if isinstance(event, h11.ConnectionClosed):
                    raise _broken(port, "closed the connection without an answer")
    except h11.LocalProtocolError as exc:  # the request's framing did not add up
        raise _broken(port, f"could not be sent the request: {exc}") from None
    except TimeoutError:
        raise _broken(port, f"did not answer within {head_timeout_s:g} s") from None
    headers = [*answer_headers(event.headers, prefix), *extra_headers]
    return ProxiedResponse(event, upstream, cleanup, headers)


# -- WebSocket --------------------------------------------------------------------------------


class _WsUpstream:
    def __init__(self, stream: ByteStream, port: int, max_bytes: int) -> None:
        self.stream = stream
        self.port = port
        self.max_bytes = max_bytes
        self.lock = anyio.Lock()
        self.proto: ClientProtocol | None = None

    async def flush(self) -> None:
        assert self.proto is not None
        async with self.lock:
            for data in self.proto.data_to_send():
                if data:
                    await self.stream.send(data)
                else:  # the protocol's "close the connection now"
                    with contextlib.suppress(OSError, anyio.BrokenResourceError):
                        await self.stream.send_eof()

    async def receive(self) -> bool:
        """Feed the protocol what the service sent; False at the end of the stream."""
        assert self.proto is not None
        try:
            data = await self.stream.receive(READ_BYTES)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.proto.receive_eof()
            return False
        self.proto.receive_data(data)
        return True

    async def handshake(
        self, path: str, headers: list[tuple[bytes, bytes]], subprotocols: list[str]
    ) -> WsResponse:
        uri = parse_uri(f"ws://127.0.0.1:{self.port}{path}")
        self.proto = ClientProtocol(
            uri,
            subprotocols=[Subprotocol(s) for s in subprotocols] or None,
            max_size=self.max_bytes,
        )
        ws_request = self.proto.connect()
        for name, value in headers:
            if name != b"host":
                ws_request.headers[name.decode("latin-1")] = value.decode("latin-1")
        self.proto.send_request(ws_request)
        await self.flush()
        while True:
            for event in self.proto.events_received():
                if isinstance(event, WsResponse):
                    if self.proto.handshake_exc is not None:
                        exc = self.proto.handshake_exc
                        raise _broken(self.port, f"refused the WebSocket: {exc}")
                    return event
            if not await self.receive():
                raise _broken(self.port, "closed the connection during the WebSocket handshake")


async def relay_websocket(
    websocket: WebSocket, stream: ByteStream, *, port: int, path: str, prefix: str, max_bytes: int
) -> None:
    """Open the service's WebSocket, accept the client's, and relay until one side closes."""
    upstream = _WsUpstream(stream, port, max_bytes)
    headers = forwarded_headers(
        websocket.headers.raw, websocket.scope, port, prefix, WS_NOT_FORWARDED
    )
    query = websocket.scope.get("query_string", b"").decode("latin-1")
    target = path + ("?" + query if query else "")
    offered = [
        p.strip()
        for value in websocket.headers.getlist("sec-websocket-protocol")
        for p in value.split(",")
        if p.strip()
    ]
    try:
        answer = await upstream.handshake(target, headers, offered)
    except (InvalidHandshake, ProtocolError) as exc:
        raise _broken(port, f"refused the WebSocket: {exc}") from None
    await websocket.accept(subprotocol=answer.headers.get("Sec-WebSocket-Protocol"))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_down, websocket, upstream, tasks.cancel_scope)
        await _up(websocket, upstream)
        tasks.cancel_scope.cancel()


async def _up(websocket: WebSocket, upstream: _WsUpstream) -> None:
    """Client to service, until the client goes."""
    assert upstream.proto is not None
    proto = upstream.proto
    while True:
        try:
            message = await websocket.receive()
        except WebSocketDisconnect:
            message = {"type": "websocket.disconnect", "code": 1000}
        if message["type"] == "websocket.disconnect":
            if proto.state is State.OPEN:
                code = int(message.get("code") or 1000)
                proto.send_close(code if 1000 <= code < 5000 and code not in (1005, 1006) else 1000)
                with contextlib.suppress(OSError, anyio.BrokenResourceError):
                    await upstream.flush()
            return
        if proto.state is not State.OPEN:
            return
        if message.get("text") is not None:
            proto.send_text(message["text"].encode())
        elif message.get("bytes") is not None:
            proto.send_binary(message["bytes"])
        try:
            await upstream.flush()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            return


async def _down(websocket: WebSocket, upstream: _WsUpstream, scope: Any) -> None:
    """Service to client, until the service closes; then the client is closed too."""
    assert upstream.proto is not None
    proto = upstream.proto
    parts: list[bytes] = []
    size = 0
    text = False
    close_code = 1000
    while True:
        alive = await upstream.receive()
        for event in proto.events_received():
            assert isinstance(event, Frame)
            if event.opcode in (Opcode.TEXT, Opcode.BINARY):
                text = event.opcode is Opcode.TEXT
                parts, size = [], 0
            elif event.opcode is not Opcode.CONT:
                continue  # ping, pong, close: the protocol answers them itself
            parts.append(bytes(event.data))
            size += len(event.data)
            if size > upstream.max_bytes:
                proto.fail(1009, "message too big")
                break
            if event.fin:
                data = b"".join(parts)
                parts, size = [], 0
                if text:
                    await websocket.send_text(data.decode("utf-8", errors="replace"))
                else:
                    await websocket.send_bytes(data)
        with contextlib.suppress(OSError, anyio.BrokenResourceError):
            await upstream.flush()
        if proto.close_code is not None:
            close_code = proto.close_code
        if not alive or proto.state is State.CLOSED:
            break
    if close_code in (1005, 1006):
        close_code = 1000
    with contextlib.suppress(RuntimeError, OSError):  # the client may have gone already
        await websocket.close(code=close_code, reason=proto.close_reason or "")
    scope.cancel()
