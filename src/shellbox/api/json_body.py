"""Reading a large JSON request body without multiplying it in memory.

FastAPI's own body parameter keeps the raw body and the parsed value for the whole request
(and the host then encoded the call again for the agent). Here the body is joined once,
parsed straight from those bytes (``pydantic_core.from_json``: no decoded copy of the whole
text), and dropped: at most twice the body for a moment, and for the rest of the call only
the parsed value, about the body's size for ASCII commands. The body budget
(``body_budget.py``) bounds how many such bodies are in flight.
"""

from __future__ import annotations

from typing import Any

import pydantic_core
from starlette.requests import Request

from shellbox.errors import InvalidRequest


async def read_json_object(request: Request, *, what: str) -> dict[str, Any]:
    """The body as a JSON object; ``what`` names it in errors ("one tool-call item")."""
    chunks: list[bytes] = []
    async for chunk in request.stream():
        if chunk:
            chunks.append(chunk)
    # One bytes object (pydantic_core copies a bytearray before parsing it; bytes it reads in
    # place): twice the body for the moment of the join, then once.
    buf = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    del chunks
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
