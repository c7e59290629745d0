"""Every error leaves as the OpenAI envelope ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.websockets import WebSocketState

from shellbox.errors import ShellboxError

log = logging.getLogger("shellbox.api")

_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def envelope(
    status: int,
    message: str,
    *,
    type: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": type or _STATUS_TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status, headers=headers)


def error_response(exc: ShellboxError) -> JSONResponse:
    headers = {}
    if exc.retryable is not None:
        headers["x-should-retry"] = "true" if exc.retryable else "false"
    return envelope(
        exc.status, exc.message, type=exc.type, param=exc.param, code=str(exc.code), headers=headers
    )


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """``("body", "action", "commands", 0)`` -> ``action.commands[0]``; the body itself (not
    an object, say) is ``body``. Only the first element is a location: a query parameter
    may well be named ``path``."""
    if not loc:
        return None
    where, parts = str(loc[0]), loc[1:]
    if where not in ("body", "query", "path", "header", "cookie", "form"):
        where, parts = "body", loc
    out = ""
    for p in map(str, parts):
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or where


def invalid_request(errors: Sequence[Any], param: str | None) -> str:
    """The message of a 400 for pydantic's ``errors`` (their first names ``param``)."""
    first = errors[0] if errors else {"msg": "invalid request"}
    where = f" at {param}" if param else ""
    msg = f"Invalid request{where}: {first.get('msg', 'invalid value')}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return msg


# Routes whose errors carry Anthropic's envelope (the OpenAI fields inside), body checks too.
ANTHROPIC_PATHS = ("/v1/messages",)


def install(app: FastAPI) -> None:
    @app.exception_handler(ShellboxError)
    async def _shellbox(_: Request, exc: ShellboxError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s: %s", type(exc).__name__, exc.message)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":  # loc is ("body", offset)
            offset = tuple(first.get("loc", ()))[-1]
            msg = f"The body is not valid JSON (at character {offset}); send one JSON object"
            return envelope(400, msg, param="body", code="invalid_value")
        param = _loc_to_param(tuple(first.get("loc", ())))
        msg = invalid_request(errors, param)
        if request.url.path in ANTHROPIC_PATHS and first.get("loc", ())[:1] == ("body",):
            error = {
                "type": "invalid_request_error",
                "message": msg,
                "param": param,
                "code": "invalid_value",
            }
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        return envelope(400, msg, param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = "Unknown route: check the URL and that it starts with /v1"
        elif exc.status_code == 405:
            message = "This route does not accept that HTTP method"
        else:
            message = str(exc.detail)
        code = "payload_too_large" if exc.status_code == 413 else None
        param = None
        if exc.status_code == 400:
            # FastAPI's own: a JSON body it could not read (bad UTF-8, nesting too deep).
            message = f"{message}: send one JSON object, encoded as UTF-8"
            code, param = "invalid_value", "body"
        return envelope(
            exc.status_code, message, param=param, code=code, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return envelope(
            500, "The server had an error while processing your request.", code="internal_error"
        )


async def deny_websocket(websocket: WebSocket, exc: ShellboxError) -> None:
    """Answer a WebSocket request that failed with the envelope, as an HTTP response when it
    was not accepted yet (what a client shows), else close it saying why (1011, or 1008 for
    a refused credential)."""
    if websocket.application_state is WebSocketState.CONNECTING:
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(error_response(exc))
        else:
            await websocket.close(code=1008 if exc.status in (401, 403, 404) else 1011)
        return
    if websocket.application_state is WebSocketState.CONNECTED:
        await websocket.close(code=1011, reason=exc.message[:120])
