"""``GET /v1/containers/{id}/pty``: a terminal over a WebSocket.

Binary messages carry the terminal's bytes both ways; text messages are JSON control
messages: ``{"type": "resize", "cols": N, "rows": N}`` from the client, and ``{"type":
"exit", "exit_code": N}`` from the server once the shell has exited, before it closes the
socket (1000). Anything refused before the upgrade (no key or a bad one, another project's
container, bad parameters, too many terminals) is an HTTP error with the usual envelope; the
socket never opens. Once open, the server closes it with 1001 when the container sleeps
(a terminal keeps it awake only while bytes cross it: ``service/pty.py``), pauses or ends,
1003 for a control message it does not know, 1009 for a message over
``limits.ws_max_message_bytes``, 1011 when the sandbox went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from shellbox.api.deps import websocket_principal
from shellbox.api.errors import error_response
from shellbox.api.strings import check_value
from shellbox.errors import InvalidRequest, ShellboxError
from shellbox.sandbox.base import PtyRequest
from shellbox.service.pty import Terminal
from shellbox.services import Services

router = APIRouter(prefix="/v1/containers", tags=["containers"])
log = logging.getLogger("shellbox.api.pty")

DEFAULT_COLS, DEFAULT_ROWS = 80, 24
MAX_SIDE = 1000  # columns or rows
# WebSocket close codes (RFC 6455, 7.4.1)
GOING_AWAY, UNSUPPORTED, TOO_BIG, INTERNAL = 1001, 1003, 1009, 1011


def _side(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SIDE:
        msg = f"{name} must be an integer from 1 to {MAX_SIDE}, not {raw!r}"
        raise InvalidRequest(msg, param=name)
    return value


def pty_request(websocket: WebSocket) -> PtyRequest:
    for name, value in websocket.query_params.multi_items():
        check_value(value, name)
    params = dict(websocket.query_params)
    command = params.get("command")
    if command is not None and not command.strip():
        msg = "command must not be empty (leave it out for an interactive shell)"
        raise InvalidRequest(msg, param="command")
    return PtyRequest(
        cols=_side(params, "cols", DEFAULT_COLS),
        rows=_side(params, "rows", DEFAULT_ROWS),
        command=command,
    )


@router.websocket("/{container_id}/pty")
async def pty(websocket: WebSocket, container_id: str) -> None:
    services: Services = websocket.app.state.services
    try:
        principal = await websocket_principal(websocket, browser_token=True)
        check_value(container_id, "container_id")
        request = pty_request(websocket)
        async with services.pty.open(principal, container_id, request) as terminal:
            await websocket.accept()
            await serve(websocket, terminal, services.settings.limits.ws_max_message_bytes)
    except ShellboxError as exc:
        if websocket.application_state == WebSocketState.CONNECTING:
            await websocket.send_denial_response(error_response(exc))
            return
        log.warning("terminal of %s failed: %s", container_id, exc)
        await _close(websocket, INTERNAL, exc.message)


async def serve(websocket: WebSocket, terminal: Terminal, max_message: int) -> None:
    """Pump both ways until the shell exits, the client leaves, or the server ends it."""
    session = terminal.session

    async def output() -> None:
        async for chunk in session.output():
            await websocket.send_bytes(chunk)  # waits while the client reads slowly
            terminal.used()

    async def control(text: str) -> str | None:
        """Apply one control message; the reason to close the socket if it is bad."""
        try:
            msg: Any = json.loads(text)
        except ValueError:
            msg = None
        if isinstance(msg, dict) and msg.get("type") == "resize":
            cols, rows = msg.get("cols"), msg.get("rows")
            if all(type(n) is int and 1 <= n <= MAX_SIDE for n in (cols, rows)):
                await session.resize(int(cols), int(rows))  # type: ignore[arg-type]
                terminal.used()
                return None
            return f"resize needs integer cols and rows from 1 to {MAX_SIDE}"
        return 'unknown control message: send {"type": "resize", "cols": N, "rows": N}'

    async def client() -> tuple[int, str] | None:
        """Keystrokes and control messages; a close to send when the client breaks a rule."""
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            data, text = message.get("bytes"), message.get("text")
            size = len(data) if data is not None else len((text or "").encode())
            if size > max_message:
                return TOO_BIG, f"a message is at most {max_message} bytes"
            if data is not None:
                await session.write(data)
                terminal.used()
            elif text is not None:
                bad = await control(text)
                if bad is not None:
                    return UNSUPPORTED, bad

    out_task = asyncio.create_task(output())
    in_task = asyncio.create_task(client())
    try:
        await asyncio.wait({out_task, in_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (out_task, in_task):
            if not task.done():
                task.cancel()
        await asyncio.gather(out_task, in_task, return_exceptions=True)
    if in_task.done() and not in_task.cancelled():
        verdict = in_task.result() if in_task.exception() is None else None
        if verdict is not None:
            await _close(websocket, *verdict)
        return  # the client left (or broke a rule): the terminal is closed with the block
    if out_task.exception() is not None:
        if isinstance(out_task.exception(), WebSocketDisconnect | OSError):
            return
        raise out_task.exception()  # type: ignore[misc]
    if session.exit_code is not None:
        with contextlib.suppress(WebSocketDisconnect, OSError):
            await websocket.send_text(json.dumps({"type": "exit", "exit_code": session.exit_code}))
        await _close(websocket, 1000, "")
    elif terminal.ended is not None:
        await _close(websocket, GOING_AWAY, terminal.ended)
    else:
        await _close(websocket, INTERNAL, "the terminal's sandbox went away")


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state != WebSocketState.CONNECTED:
        return
    reason = reason.encode()[:120].decode(errors="ignore")  # a close frame's reason fits 123
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        await websocket.close(code, reason)
