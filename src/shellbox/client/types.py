"""Typed views of what the calls, egress, skills and workspace endpoints return.

Each class keeps the server's JSON in ``raw`` as well, so fields added later by the server are
never lost to an older client.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypedDict, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Outcome:
    type: Literal["exit", "timeout"]
    exit_code: int | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Outcome:
        if data.get("type") == "timeout":
            return cls("timeout")
        code = data.get("exit_code")
        return cls("exit", int(code) if code is not None else None)


@dataclass(frozen=True)
class CommandOutput:
    """One command's result: captured output (capped by ``max_output_length``) and outcome."""

    stdout: str
    stderr: str
    outcome: Outcome

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CommandOutput:
        return cls(
            str(data.get("stdout", "")),
            str(data.get("stderr", "")),
            Outcome.from_wire(data.get("outcome") or {}),
        )

    @property
    def exit_code(self) -> int | None:
        return self.outcome.exit_code

    @property
    def timed_out(self) -> bool:
        return self.outcome.type == "timeout"


@dataclass(frozen=True)
class FileCitation:
    """A file under /mnt/data that the call created or changed."""

    container_id: str
    file_id: str
    filename: str


@dataclass(frozen=True)
class ShellCallOutput:
    """The ``shell_call_output`` item: one entry per command, in order."""

    id: str
    call_id: str
    status: str
    max_output_length: int | None
    output: list[CommandOutput]
    files: list[FileCitation]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ShellCallOutput:
        files = [
            FileCitation(str(f.get("container_id", "")), str(f["file_id"]), str(f["filename"]))
            for f in data.get("files") or []
            if isinstance(f, dict) and "file_id" in f and "filename" in f
        ]
        return cls(
            id=str(data.get("id", "")),
            call_id=str(data.get("call_id", "")),
            status=str(data.get("status", "completed")),
            max_output_length=data.get("max_output_length"),
            output=[CommandOutput.from_wire(o) for o in data.get("output") or []],
            files=files,
            raw=data,
        )


@dataclass(frozen=True)
class LocalShellCallOutput:
    """The ``local_shell_call_output`` item: ``output`` is the text the model reads."""

    call_id: str
    output: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> LocalShellCallOutput:
        return cls(str(data.get("call_id") or data.get("id") or ""), str(data["output"]), data)


@dataclass(frozen=True)
class ApplyPatchCallOutput:
    """The ``apply_patch_call_output`` item; ``output`` explains a failure to the model."""

    call_id: str
    status: Literal["completed", "failed"]
    output: str
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> ApplyPatchCallOutput:
        status: Literal["completed", "failed"] = (
            "completed" if data.get("status") == "completed" else "failed"
        )
        return cls(str(data.get("call_id", "")), status, str(data.get("output") or ""), data)


# -- streamed calls --------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputDelta:
    """Output a command printed, as it arrives (before the command ends)."""

    command_index: int
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class CommandDone:
    command_index: int
    output: CommandOutput


@dataclass(frozen=True)
class CallDone:
    """The last event: the whole output item."""

    item: ShellCallOutput


@dataclass(frozen=True)
class ServerEvent:
    """Any other event the server sent (for example ``response.output_item.added``)."""

    type: str
    data: dict[str, Any]


StreamEvent = OutputDelta | CommandDone | CallDone | ServerEvent


# -- lists -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a cursor-paginated list; pass ``last_id`` as ``after`` for the next."""

    data: list[T]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class EgressRecord(TypedDict, total=False):
    """One egress attempt from a container (``object: "container.egress_event"``).

    ``decision`` is ``allowed`` or ``refused``; ``path`` has no query string. Headers, bodies
    and secrets are never recorded.
    """

    id: str
    object: str
    container_id: str
    created_at: int
    created_at_ms: int
    method: str
    scheme: str
    host: str
    port: int
    path: str
    decision: str
    reason: str | None
    status_code: int | None
    request_bytes: int
    response_bytes: int


class MountedSkill(TypedDict, total=False):
    """A skill mounted read-only in a container at ``path`` (``/mnt/skills/<name>``).

    ``type`` is ``skill_reference`` (with ``skill_id`` and ``version``) or ``inline``.
    """

    type: str
    name: str
    description: str
    skill_id: str | None
    version: str | None
    path: str


@dataclass(frozen=True)
class WorkspaceFile:
    """What ``workspace.write`` stored: the absolute path in the container and its size."""

    path: str
    bytes: int


# -- containers and snapshots ----------------------------------------------------------------


@dataclass(frozen=True)
class Container:
    """A container as the server describes it (``object: "container"``); the ``openai``
    SDK's ``containers`` resource reads the same objects."""

    id: str
    name: str
    status: str  # running | sleeping | paused | expired
    created_at: int
    last_active_at: int
    memory_limit: str
    expires_after_minutes: int | None
    network_policy: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Container:
        expires = data.get("expires_after") or {}
        minutes = expires.get("minutes") if isinstance(expires, dict) else None
        return cls(
            id=str(data["id"]),
            name=str(data.get("name", "")),
            status=str(data.get("status", "")),
            created_at=int(data.get("created_at", 0)),
            last_active_at=int(data.get("last_active_at", 0)),
            memory_limit=str(data.get("memory_limit", "")),
            expires_after_minutes=int(minutes) if minutes is not None else None,
            network_policy=dict(data.get("network_policy") or {}),
            raw=data,
        )


@dataclass(frozen=True)
class Snapshot:
    """A container's saved writable state (``object: "container.snapshot"``): ``/mnt/data``,
    ``/home/user`` and the rest of its root filesystem's own files, not ``/tmp``.

    ``bytes`` counts against the project's snapshot quota; the snapshot is deleted at
    ``expires_at`` unless a fork uses it before (which moves ``last_used_at``)."""

    id: str
    container_id: str
    name: str | None
    status: str
    bytes: int
    created_at: int
    last_used_at: int
    expires_at: int | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Snapshot:
        name = data.get("name")
        expires_at = data.get("expires_at")
        return cls(
            id=str(data["id"]),
            container_id=str(data.get("container_id", "")),
            name=str(name) if name is not None else None,
            status=str(data.get("status", "")),
            bytes=int(data.get("bytes", 0)),
            created_at=int(data.get("created_at", 0)),
            last_used_at=int(data.get("last_used_at", 0)),
            expires_at=int(expires_at) if expires_at is not None else None,
            raw=data,
        )


@dataclass(frozen=True)
class PortLink:
    """A URL that opens a service in a container without a key, until ``expires_at``."""

    url: str
    expires_at: int  # Unix seconds
    container_id: str
    port: int

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> PortLink:
        return cls(
            str(data["url"]), int(data["expires_at"]), str(data["container_id"]), int(data["port"])
        )
