"""The node's side of the byte streams (``connect_port``, ``pty``) a ``RemoteRuntime`` opens
as WebSockets; ``shellbox.sandbox.remote_streams`` describes the exchange.

Each relay pumps both ways in two tasks and awaits every send before it reads more, so the
stream's back-pressure passes through: uvicorn reads the next message from the API server
only once the relay has taken the last, and the relay reads the service (or the terminal)
only as fast as the API server's socket takes the bytes.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
from anyio.abc import ByteStream
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from shellbox.sandbox.base import PtySession
from shellbox.sandbox.remote_streams import BROKEN, CHUNK, EOF


def _control(message: Any) -> dict[str, Any]:
    try:
        raw = json.loads(message.get("text") or "")
    except ValueError:
        raw = None
    return raw if isinstance(raw, dict) else {}


async def _close(websocket: WebSocket, code: int) -> None:
    if websocket.application_state != WebSocketState.CONNECTED:
        return
    with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
        await websocket.close(code)


async def _sent(websocket: WebSocket, message: bytes | str) -> bool:
    """Send one message; False when the API server has gone (its ``receive`` sees that)."""
    try:
        if isinstance(message, bytes):
            await websocket.send_bytes(message)
        else:
            await websocket.send_text(message)
    except (WebSocketDisconnect, OSError, RuntimeError):
        return False
    return True


async def relay_port(websocket: WebSocket, stream: ByteStream) -> None:
    """Relay an accepted socket and a connection to a service until both ends are done (or
    the API server goes); the connection is closed with it."""
    done = {"up": False, "down": False}
    async with stream, anyio.create_task_group() as tasks:

        async def up() -> None:
            """API server to service; its ``eof`` half-closes the service's connection."""
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    tasks.cancel_scope.cancel()  # the caller closed: so is the connection
                    return
                data = message.get("bytes")
                if data is not None:
                    try:
                        await stream.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        await _close(websocket, BROKEN)
                        tasks.cancel_scope.cancel()
                        return
                elif _control(message).get("type") == "eof":
                    with contextlib.suppress(OSError, anyio.BrokenResourceError):
                        await stream.send_eof()
                    done["up"] = True
                    if done["down"]:
                        await _close(websocket, 1000)
                        tasks.cancel_scope.cancel()
                        return

        async def down() -> None:
            """Service to API server; its end is an ``eof``, a reset a broken close."""
            while True:
                try:
                    data = await stream.receive(CHUNK)
                except anyio.EndOfStream:
                    break
                except (anyio.BrokenResourceError, OSError):
                    await _close(websocket, BROKEN)
                    tasks.cancel_scope.cancel()
                    return
                if not await _sent(websocket, data):
                    tasks.cancel_scope.cancel()
                    return
            if not await _sent(websocket, EOF):
                tasks.cancel_scope.cancel()
                return
            done["down"] = True
            if done["up"]:
                await _close(websocket, 1000)
                tasks.cancel_scope.cancel()

        tasks.start_soon(down)
        await up()


async def relay_pty(websocket: WebSocket, session: PtySession) -> None:
    """Relay an accepted socket and a terminal until the shell ends (its exit code sent, then
    an orderly close) or the API server closes (the terminal is closed with it)."""
    try:
        async with anyio.create_task_group() as tasks:

            async def keys() -> None:
                """Keystrokes and resizes, until the API server closes."""
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        tasks.cancel_scope.cancel()
                        return
                    data = message.get("bytes")
                    if data is not None:
                        await session.write(data)
                        continue
                    control = _control(message)
                    if control.get("type") == "resize":
                        cols, rows = control.get("cols"), control.get("rows")
                        if type(cols) is int and type(rows) is int:
                            await session.resize(cols, rows)

            tasks.start_soon(keys)
            async for chunk in session.output():
                if not await _sent(websocket, chunk):
                    break
            else:
                exit_code = session.exit_code
                if await _sent(websocket, json.dumps({"type": "exit", "exit_code": exit_code})):
                    await _close(websocket, 1000)
            tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await session.close()
