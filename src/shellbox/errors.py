"""The exceptions shellbox raises, and the error codes they carry on the wire.

Every error a client can cause is a subclass of ``ShellboxError`` with an HTTP ``status``,
an OpenAI error ``type`` and a stable ``code``; ``api.errors`` renders them as the OpenAI
envelope ``{"error": {"message", "type", "param", "code"}}``.

    ShellboxError
    ├── InvalidRequest (400)
    │   ├── PayloadTooLarge (413)
    │   ├── PathOutsideWorkspace: a symbolic link on the path leads out of /mnt/data
    │   └── IdempotencyKeyReused: the key came with another request
    ├── AuthenticationFailed (401)
    ├── PermissionDenied (403: an admin endpoint, a project key)
    ├── NotFound (404)
    │   ├── ContainerNotFound, FileNotFound, SkillNotFound, ResponseNotFound, SnapshotNotFound
    ├── Conflict (409, never retried)
    │   ├── ContainerNotRunning
    │   └── IdempotencyKeyInterrupted: its first request was cut off by a restart
    ├── IdempotencyKeyInUse (409, retried): its first request is still running
    ├── QuotaExceeded (429)
    │   └── CapacityExceeded: the host runs all the containers it may (retry later)
    ├── ContainerBusy (429, retried): the container runs as many calls as it takes
    ├── ServerBusy (429, retried): in-flight request bodies fill the server's memory budget
    ├── SnapshotsUnavailable (501): the server's storage has no copy-on-write snapshots
    ├── UpstreamError (502)
    ├── NodeUnavailable (503, retried): the node that holds the container cannot be reached
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
    path_outside_workspace = "path_outside_workspace"
    invalid_api_key = "invalid_api_key"
    admin_key_required = "admin_key_required"
    not_found = "not_found"
    container_not_found = "container_not_found"
    file_not_found = "file_not_found"
    skill_not_found = "skill_not_found"
    response_not_found = "response_not_found"
    snapshot_not_found = "snapshot_not_found"
    snapshots_unavailable = "snapshots_unavailable"
    conflict = "conflict"
    idempotency_key_reused = "idempotency_key_reused"
    idempotency_key_in_use = "idempotency_key_in_use"
    idempotency_key_interrupted = "idempotency_key_interrupted"
    container_expired = "container_expired"
    quota_exceeded = "quota_exceeded"
    disk_quota_exceeded = "disk_quota_exceeded"
    capacity_exceeded = "capacity_exceeded"
    container_busy = "container_busy"
    server_busy = "server_busy"
    upstream_error = "upstream_error"
    node_unavailable = "node_unavailable"
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


class DiskQuotaExceeded(PayloadTooLarge):
    """A write from the host (an upload, a patch) does not fit in the container's disk."""

    code = ErrorCode.disk_quota_exceeded


class PathOutsideWorkspace(InvalidRequest):
    """A symbolic link on the path leads out of the container's /mnt/data."""

    code = ErrorCode.path_outside_workspace


class IdempotencyKeyReused(InvalidRequest):
    """Stripe's choice (a 400 ``idempotency_error``) rather than the IETF draft's 422."""

    code = ErrorCode.idempotency_key_reused


class AuthenticationFailed(ShellboxError):
    status = 401
    type = "authentication_error"
    code = ErrorCode.invalid_api_key


class PermissionDenied(ShellboxError):
    """A valid key that may not do this (a project key on an admin endpoint)."""

    status = 403
    type = "invalid_request_error"
    code = ErrorCode.admin_key_required
    retryable = False


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


class SnapshotNotFound(NotFound):
    code = ErrorCode.snapshot_not_found


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


class CapacityExceeded(QuotaExceeded):
    """Every container this host may hold exists (``runtime.uid_range_count``): a limit of
    the host, not of the caller's project, that frees up as containers end."""

    code = ErrorCode.capacity_exceeded
    retryable = True


class ContainerBusy(ShellboxError):
    """Transient: the container's agent runs as many calls at once as it takes."""

    status = 429
    type = "rate_limit_error"
    code = ErrorCode.container_busy
    retryable = True


class ServerBusy(ShellboxError):
    """Transient: request bodies in flight fill the server's memory budget for them."""

    status = 429
    type = "rate_limit_error"
    code = ErrorCode.server_busy
    retryable = True


class SnapshotsUnavailable(ShellboxError):
    """Snapshots and forks need btrfs (``storage.backend = "btrfs"``); this server has plain
    directories, and copying a workspace instead would hide a cost that grows with its size."""

    status = 501
    type = "invalid_request_error"
    code = ErrorCode.snapshots_unavailable
    retryable = False


class UpstreamError(ShellboxError):
    status = 502
    type = "server_error"
    code = ErrorCode.upstream_error


class NodeUnavailable(ShellboxError):
    """The sandbox node that holds the container did not answer (down, unreachable, or
    restarting): its containers are not lost, only out of reach until it is back."""

    status = 503
    type = "server_error"
    code = ErrorCode.node_unavailable
    retryable = True


class SandboxError(ShellboxError):
    status = 500
    type = "server_error"
    code = ErrorCode.sandbox_error


class ImageBuildError(SandboxError):
    code = ErrorCode.image_build_failed


class AgentUnavailable(SandboxError):
    code = ErrorCode.agent_unavailable


class AgentOutdated(AgentUnavailable):
    """The agent answers in another protocol version (a container started by an older or newer
    shellbox and adopted after an upgrade): it must be started again with this one's agent."""


class AgentNotReachable(AgentUnavailable):
    """The agent's socket refused the connection: no request reached the sandbox, so it is
    safe to start the container again and send the request once more."""
