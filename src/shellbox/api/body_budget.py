"""A server-wide budget for the request bodies in flight, so that memory stays bounded however
many large calls arrive at once.

A call may carry 100 commands of 1 MiB each: about 100 MiB of JSON, held (parsed) for as long
as the call runs. Every JSON body larger than ``SMALL_BODY_BYTES`` reserves its declared size
(the body cap when it comes chunked, without a length) from ``limits.body_budget_bytes``
before a byte of it is read, and gives it back when its response is complete. Past the budget
a request *queues*, first come first served, with its body still unread in the client's
socket (so it costs nothing meanwhile), for up to ``limits.body_budget_wait_s``; then it is
answered 429 ``server_busy`` (retried by the SDKs). Small bodies never wait: they cost
little, and must not queue behind large ones. Multipart uploads are spooled to disk by the
form parser and are left out.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from starlette.types import ASGIApp, Receive, Scope, Send

from shellbox.api.middleware import is_port_path
from shellbox.errors import ServerBusy

SMALL_BODY_BYTES = 1 << 20


class BodyBudget:
    """Bytes reserved by bodies in flight, granted in arrival order."""

    def __init__(self, total_bytes: int, wait_s: float) -> None:
        self.total_bytes = total_bytes
        self.wait_s = wait_s
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def cost(self, size: int) -> int:
        """What a body of ``size`` bytes reserves: one larger than the whole budget is let in
        alone, rather than never."""
        return min(size, self.total_bytes)

    async def acquire(self, size: int) -> bool:
        """Reserve ``cost(size)``; False if no room came within ``wait_s``."""
        n = self.cost(size)
        if not self._waiters and self.used + n <= self.total_bytes:
            self.used += n
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_s):
                await fut
        except BaseException as exc:  # timed out, or the client left while it waited
            if entry in self._waiters:
                self._waiters.remove(entry)
                self._grant()  # it may have been the head: the next may fit now
            elif fut.done() and not fut.cancelled():
                self.release(size)  # granted just as the wait ended: not used after all
            if isinstance(exc, TimeoutError):
                return False
            raise
        return True

    def release(self, size: int) -> None:
        self.used -= self.cost(size)
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.used + n > self.total_bytes:
                return
            self._waiters.popleft()
            self.used += n
            fut.set_result(None)


class BodyBudgetMiddleware:
    """Holds each large JSON request to the ``BodyBudget`` for as long as it runs."""

    def __init__(self, app: ASGIApp, *, budget: BodyBudget, max_json_bytes: int) -> None:
        self.app = app
        self.budget = budget
        self.max_json_bytes = max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_port_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        size = 0
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    size = 0
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                size = max(size, self.max_json_bytes)
            elif name == b"content-type" and value[:10].lower() == b"multipart/":
                await self.app(scope, receive, send)
                return
        if size <= SMALL_BODY_BYTES:
            await self.app(scope, receive, send)
            return
        if not await self.budget.acquire(size):
            await _send_busy(send, self.budget)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.budget.release(size)


async def _send_busy(send: Send, budget: BodyBudget) -> None:
    exc = ServerBusy(
        f"The server is holding as many large request bodies as its memory budget allows "
        f"({budget.total_bytes} bytes, limits.body_budget_bytes), and no room came within "
        f"{budget.wait_s:g} s; send the request again shortly."
    )
    body = json.dumps(
        {"error": {"message": exc.message, "type": exc.type, "param": None, "code": exc.code}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
                (b"x-should-retry", b"true"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
