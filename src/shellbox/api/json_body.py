"""Reading a large JSON request body without multiplying it in memory.

FastAPI's own body parameter keeps the raw body and the parsed value for the whole request
(and the host then encoded the call again for the agent). Here the body is joined once,
parsed straight from those bytes (``pydantic_core.from_json``: no decoded copy of the whole
text), and dropped: at most twice the body for a moment, and for the rest of the call only
the parsed value, about the body's size for ASCII commands. The body budget
(``body_budget.py``) bounds how many such bodies are in flight.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pydantic_core
from starlette.requests import Request

from shellbox.api.strings import check_value
from shellbox.errors import InvalidRequest

# The body's digest, kept on ``request.state`` for an Idempotency-Key's fingerprint: the
# stream is consumed here, so ``Request.body()`` cannot be read again (api/idempotency.py).
BODY_SHA256 = "body_sha256"


async def read_json_object(request: Request, *, what: str) -> dict[str, Any]:
    """The body as a JSON object; ``what`` names it in errors ("one tool-call item")."""
    media = request.headers.get("content-type", "application/json").split(";", 1)[0]
    media = media.strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        msg = f"the content type is {media!r}: send {what} as application/json"
        raise InvalidRequest(msg, param="body")
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
        raise InvalidRequest(msg, param="body")
    if "idempotency-key" in request.headers:
        setattr(request.state, BODY_SHA256, hashlib.sha256(buf).hexdigest())
    try:
        value = pydantic_core.from_json(buf)
    except ValueError as exc:
        _name_the_bad_string(buf)
        msg = f"the request body is not valid JSON ({exc}): send {what} as a JSON object"
        raise InvalidRequest(msg, param="body") from None
    del buf
    if not isinstance(value, dict):
        msg = f"the request body is a JSON {type(value).__name__}: send {what} as a JSON object"
        raise InvalidRequest(msg, param="body")
    return value


def _name_the_bad_string(buf: bytes) -> None:
    """pydantic_core refuses a lone UTF-16 surrogate (``"\\ud800"``) as bad JSON; Python's
    json reads it, so that the 400 can name the field that holds it (``api.strings``)."""
    try:
        value = json.loads(buf)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read
        return
    check_value(value)
