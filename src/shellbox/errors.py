"""The exceptions shellbox raises, and the error codes they carry on the wire.

Every error a client can cause is a subclass of ``ShellboxError`` with an HTTP ``status``,
an OpenAI error ``type`` and a stable ``code``; ``api.errors`` renders them as the OpenAI
envelope ``{"error": {"message", "type", "param", "code"}}``.

    ShellboxError
    ├── InvalidRequest (400)
    │   ├── PayloadTooLarge (413)
    │   └── IdempotencyKeyReused: the key came with another request
    ├── AuthenticationFailed (401)
    ├── NotFound (404)
    │   ├── ContainerNotFound, FileNotFound, SkillNotFound, ResponseNotFound
    ├── Conflict (409, never retried)
    │   ├── ContainerNotRunning
    │   └── IdempotencyKeyInterrupted: its first request was cut off by a restart
    ├── IdempotencyKeyInUse (409, retried): its first request is still running
    ├── QuotaExceeded (429)
    ├── UpstreamError (502)
    └── SandboxError (500): the sandbox itself failed (crun, the agent, the image)
        ├── ImageBuildError
        └── AgentUnavailable
            └── AgentNotReachable: nothing was sent (the sandbox is down)
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar


class ErrorCode(StrEnum):
    invalid_value = "invalid_value"
    missing_required_parameter = "missing_required_parameter"
    payload_too_large = "payload_too_large"
    invalid_api_key = "invalid_api_key"
    not_found = "not_found"
    container_not_found = "container_not_found"
    file_not_found = "file_not_found"
    skill_not_found = "skill_not_found"
    response_not_found = "response_not_found"
    conflict = "conflict"
    idempotency_key_reused = "idempotency_key_reused"
    idempotency_key_in_use = "idempotency_key_in_use"
    idempotency_key_interrupted = "idempotency_key_interrupted"
    container_expired = "container_expired"
    quota_exceeded = "quota_exceeded"
    upstream_error = "upstream_error"
    sandbox_error = "sandbox_error"
    image_build_failed = "image_build_failed"
    agent_unavailable = "agent_unavailable"
    internal_error = "internal_error"


class ShellboxError(Exception):
    """Base of every error shellbox raises on purpose."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    code: ErrorCode = ErrorCode.internal_error
    retryable: ClassVar[bool | None] = None  # None: let the client's status rule decide

    def __init__(
        self, message: str, *, param: str | None = None, code: ErrorCode | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(ShellboxError):
    status = 400
    type = "invalid_request_error"
    code = ErrorCode.invalid_value


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = ErrorCode.payload_too_large


class IdempotencyKeyReused(InvalidRequest):
    """Stripe's choice (a 400 ``idempotency_error``) rather than the IETF draft's 422."""

    code = ErrorCode.idempotency_key_reused


class AuthenticationFailed(ShellboxError):
    status = 401
    type = "authentication_error"
    code = ErrorCode.invalid_api_key


class NotFound(ShellboxError, LookupError):
    status = 404
    type = "invalid_request_error"
    code = ErrorCode.not_found


class ContainerNotFound(NotFound):
    code = ErrorCode.container_not_found


class FileNotFound(NotFound):
    code = ErrorCode.file_not_found


class SkillNotFound(NotFound):
    code = ErrorCode.skill_not_found


class ResponseNotFound(NotFound):
    code = ErrorCode.response_not_found


class Conflict(ShellboxError):
    """A deterministic conflict: retrying the same request cannot succeed."""

    status = 409
    type = "invalid_request_error"
    code = ErrorCode.conflict
    retryable = False


class ContainerNotRunning(Conflict):
    code = ErrorCode.container_expired


class IdempotencyKeyInterrupted(Conflict):
    code = ErrorCode.idempotency_key_interrupted


class IdempotencyKeyInUse(ShellboxError):
    """The first request with this key is still running: retry (after it ends, the retry gets
    its result)."""

    status = 409
    type = "invalid_request_error"
    code = ErrorCode.idempotency_key_in_use
    retryable = True


class QuotaExceeded(ShellboxError):
    status = 429
    type = "rate_limit_error"
    code = ErrorCode.quota_exceeded
    retryable = False


class UpstreamError(ShellboxError):
    status = 502
    type = "server_error"
    code = ErrorCode.upstream_error


class SandboxError(ShellboxError):
    status = 500
    type = "server_error"
    code = ErrorCode.sandbox_error


class ImageBuildError(SandboxError):
    code = ErrorCode.image_build_failed


class AgentUnavailable(SandboxError):
    code = ErrorCode.agent_unavailable


class AgentNotReachable(AgentUnavailable):
    """The agent's socket refused the connection: no request reached the sandbox, so it is
    safe to start the container again and send the request once more."""
