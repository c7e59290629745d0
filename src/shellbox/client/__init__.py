"""A small typed client for what the ``openai`` SDK does not cover.

    from shellbox.client import Shellbox

    sb = Shellbox(base_url="http://127.0.0.1:8000/v1", api_key="sk-...")
    container = sb.openai.containers.create(name="work")       # the openai SDK, reused
    out = sb.calls.shell(container.id, ["echo hi"])             # POST /v1/containers/{id}/calls
    with sb.calls.stream_shell(container.id, ["make"]) as stream:
        for event in stream: ...                                # deltas while it runs
    snap = sb.snapshots.create(container.id, name="prepared")   # its files saved
    fork = sb.snapshots.fork(snap.id, name="try-2")             # a new container from them
    sb.containers.pause(fork.id); sb.containers.resume(fork.id)

    with sb.pty(container.id) as term:                           # a terminal (WebSocket)
        term.send("ls\\n"); term.recv()

``AsyncShellbox`` is the same with ``await``. Failures raise the classes in
``shellbox.client.errors``. This package needs only ``httpx``; ``.openai`` needs ``openai``.
"""

from __future__ import annotations

from shellbox.client.async_client import AsyncShellbox, AsyncShellCallStream
from shellbox.client.errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    InternalServerError,
    InvalidResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    ShellboxClientError,
    StreamError,
)
from shellbox.client.sync_client import Shellbox, ShellCallStream
from shellbox.client.terminal import AsyncTerminal, Terminal
from shellbox.client.types import (
    ApplyPatchCallOutput,
    CallDone,
    CommandDone,
    CommandOutput,
    Container,
    EgressRecord,
    FileCitation,
    LocalShellCallOutput,
    MountedSkill,
    Outcome,
    OutputDelta,
    Page,
    PortLink,
    ServerEvent,
    ShellCallOutput,
    Snapshot,
    StreamEvent,
    WorkspaceFile,
)

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "ApplyPatchCallOutput",
    "AsyncShellCallStream",
    "AsyncShellbox",
    "AsyncTerminal",
    "AuthenticationError",
    "BadRequestError",
    "CallDone",
    "CommandDone",
    "CommandOutput",
    "ConflictError",
    "Container",
    "EgressRecord",
    "FileCitation",
    "InternalServerError",
    "InvalidResponseError",
    "LocalShellCallOutput",
    "MountedSkill",
    "NotFoundError",
    "Outcome",
    "OutputDelta",
    "Page",
    "PermissionDeniedError",
    "PortLink",
    "RateLimitError",
    "ServerEvent",
    "ShellCallOutput",
    "ShellCallStream",
    "Shellbox",
    "ShellboxClientError",
    "Snapshot",
    "StreamError",
    "StreamEvent",
    "Terminal",
    "WorkspaceFile",
]
