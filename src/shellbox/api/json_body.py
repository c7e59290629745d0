"""Reading a large JSON request body without multiplying it in memory.

FastAPI's own body parameter keeps the raw body (joined from its chunks: twice its size for a
moment) and the parsed value for the whole request. Here the body is read into one buffer of
its declared size, parsed straight from those bytes (``pydantic_core.from_json``: no decoded
copy of the whole text), and the buffer dropped: what stays for the call is the parsed value,
about the body's size for ASCII commands. The body budget (``body_budget.py``) bounds how many
such bodies are in flight.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from starlette.requests import Request

from shellbox.errors import InvalidRequest


async def read_json_object(request: Request, *, what: str) -> dict[str, Any]:
    """The body as a JSON object; ``what`` names it in errors ("one tool-call item")."""
    try:
        declared = int(request.headers.get("content-length", "0"))
    except ValueError:
        declared = 0
    # The middleware has refused declared sizes past the body cap already.
    buf = bytearray(declared) if declared > 0 else bytearray()
    filled = 0
    async for chunk in request.stream():
        end = filled + len(chunk)
        if end <= declared:
            buf[filled:end] = chunk
        else:
            buf[filled:] = chunk
        filled = end
    del buf[filled:]
    if not buf:
        msg = f"the request body is empty: send {what} as a JSON object"
        raise InvalidRequest(msg)
    try:
        value = pydantic_core.from_json(buf)
    except ValueError as exc:
        msg = f"the request body is not valid JSON ({exc}): send {what} as a JSON object"
        raise InvalidRequest(msg) from None
    del buf
    if not isinstance(value, dict):
        msg = f"the request body is a JSON {type(value).__name__}: send {what} as a JSON object"
        raise InvalidRequest(msg)
    return value
