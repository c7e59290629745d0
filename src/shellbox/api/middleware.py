"""Pure ASGI middleware (cheaper than BaseHTTPMiddleware on the hot path): an
``x-request-id`` on every response, and a cap on request body size enforced while it arrives.

Multipart bodies (uploads) may be as large as the upload cap plus some room for the multipart
framing; every other body (JSON) up to ``max_json_bytes``, which fits a call of 100 commands
of 1 MiB each."""

from __future__ import annotations

import json
import logging

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shellbox.ids import new_id

MULTIPART_OVERHEAD = 64 << 10  # boundaries, part headers and small fields around one file


log = logging.getLogger("shellbox.api")


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes its cap. An HTTPException, so that FastAPI's
    body parsing lets it through (it turns other errors there into a 400)."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, *, upload_max_bytes: int, max_json_bytes: int) -> None:
        self.app = app
        self.upload_max_bytes = upload_max_bytes
        self.max_multipart_bytes = upload_max_bytes + MULTIPART_OVERHEAD
        self.max_json_bytes = max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_id("req_", 8)
        rid = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid)]
            await send(message)

        declared = 0
        multipart = False
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
            elif name == b"content-type":
                multipart = value[:10].lower() == b"multipart/"
        limit = self.max_multipart_bytes if multipart else self.max_json_bytes
        if is_port_path(scope["path"]):  # streamed to the service, never held: the upload cap
            limit = self.upload_max_bytes
        if declared > limit:
            await self._send_error(send_with_id, 413, self._too_large(multipart))
            return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(self._too_large(multipart))
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send_with_id(message)

        try:
            await self.app(scope, counted_receive, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await self._send_error(send_with_id, 413, exc.detail)
        except Exception:
            # Unhandled errors are answered here rather than by Starlette's outermost error
            # middleware, so that they too carry the envelope and the x-request-id.
            if started:
                raise
            log.exception("unexpected error in request %s", request_id)
            message = "The server had an error while processing your request."
            await self._send_error(send_with_id, 500, message)

    def _too_large(self, multipart: bool) -> str:
        what, limit = (
            ("upload", self.upload_max_bytes)
            if multipart
            else ("request body", self.max_json_bytes)
        )
        return f"The {what} is larger than this server's limit of {limit} bytes."

    @staticmethod
    async def _send_error(send: Send, status: int, message: str) -> None:
        code, kind = (
            ("payload_too_large", "invalid_request_error")
            if status == 413
            else ("internal_error", "server_error")
        )
        body = json.dumps(
            {"error": {"message": message, "type": kind, "param": None, "code": code}}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def is_port_path(path: str) -> bool:
    """Whether the request goes to a service inside a container (``routes/ports.py``): its
    body is streamed there as it arrives, never held in memory."""
    if path.startswith("/v1/port-links/"):
        return True
    parts = path.split("/", 5)
    return len(parts) > 5 and parts[2] == "containers" and parts[4] == "ports"
