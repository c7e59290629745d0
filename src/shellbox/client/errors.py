"""The exceptions the shellbox client raises.

Every failure of a request is one of these, so callers can tell "the server said no" from
"the server was not there" without parsing messages. API errors mirror the server's envelope
``{"error": {"message", "type", "param", "code"}}`` field for field.

    ShellboxClientError
    ├── APIConnectionError        the request did not get an answer (refused, reset, DNS)
    │   └── APITimeoutError       ... because a timeout ran out
    ├── APIStatusError            the server answered with a non-2xx status
    │   ├── BadRequestError          400, 413, 422
    │   ├── AuthenticationError      401
    │   ├── PermissionDeniedError    403
    │   ├── NotFoundError            404
    │   ├── ConflictError            409
    │   ├── RateLimitError           429
    │   └── InternalServerError      >= 500
    ├── StreamError               a streamed call failed after its 200 (an SSE ``error`` event)
    └── InvalidResponseError      the server's answer is not what the API promises
"""

from __future__ import annotations

import json
from typing import Any

import httpx


class ShellboxClientError(Exception):
    """Base of every error the client raises."""


class APIConnectionError(ShellboxClientError):
    """No response: the server could not be reached or the connection broke."""

    def __init__(self, message: str, *, request: httpx.Request | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.request = request


class APITimeoutError(APIConnectionError, TimeoutError):
    """A connect, read or write timeout ran out before the server answered."""


class APIStatusError(ShellboxClientError):
    """The server answered with an error status; the fields are its error envelope."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        request_id: str | None = None,
        body: object = None,
    ) -> None:
        super().__init__(f"Error code: {status_code} - {message}")
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code
        self.request_id = request_id
        self.body = body


class BadRequestError(APIStatusError):
    """400 (and 413/422): the request itself is wrong; ``param`` names what."""


class AuthenticationError(APIStatusError):
    """401: missing or unknown API key."""


class PermissionDeniedError(APIStatusError):
    """403."""


class NotFoundError(APIStatusError, LookupError):
    """404: no such container, file or route (or it belongs to another project)."""


class ConflictError(APIStatusError):
    """409: the object's state forbids this (for example an expired container)."""


class RateLimitError(APIStatusError):
    """429: a quota of the project is used up."""


class InternalServerError(APIStatusError):
    """5xx: the server or its sandbox failed."""


class StreamError(ShellboxClientError):
    """A streamed call reported an error after the stream had started."""

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param


class InvalidResponseError(ShellboxClientError):
    """The response could not be understood (not JSON, or missing required fields)."""


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: BadRequestError,
    422: BadRequestError,
    429: RateLimitError,
}


def status_error(response: httpx.Response, body: bytes) -> APIStatusError:
    """The exception for an error response whose body has been read into ``body``."""
    parsed: Any = None
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        parsed = None
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(err, dict):
        err = parsed if isinstance(parsed, dict) else {}
    message = err.get("message")
    if not isinstance(message, str) or not message:
        raw = body.decode("utf-8", "replace").strip()
        message = raw[:500] or f"HTTP {response.status_code} {response.reason_phrase}"
    status = response.status_code
    cls = _STATUS_ERRORS.get(status, InternalServerError if status >= 500 else APIStatusError)

    def field(key: str) -> str | None:
        value = err.get(key)
        return None if value is None else str(value)

    return cls(
        message,
        status_code=status,
        type=field("type"),
        param=field("param"),
        code=field("code"),
        request_id=response.headers.get("x-request-id"),
        body=parsed,
    )


def transport_error(exc: httpx.TransportError) -> APIConnectionError:
    """Translate httpx's transport failures; timeouts get their own class."""
    request = None
    try:
        request = exc.request
    except RuntimeError:  # httpx raises when the error carries no request
        request = None
    where = f" ({request.method} {request.url})" if request is not None else ""
    if isinstance(exc, httpx.TimeoutException):
        msg = f"Request timed out{where}: {type(exc).__name__}"
        return APITimeoutError(msg, request=request)
    detail = str(exc) or type(exc).__name__
    msg = f"Connection error{where}: {detail}"
    return APIConnectionError(msg, request=request)
