"""What a sandbox runtime is: the ``Runtime`` protocol and the values it trades in.

A runtime is the "deployment" half (where a container lives: crun on this host today,
Kubernetes later); the in-container agent is the "runtime" half of SWE-ReX's split and is
reached through ``Runtime.exec``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

MemoryLimit = Literal["1g", "4g", "16g", "64g"]
MEMORY_LIMIT_BYTES: dict[str, int] = {
    "1g": 1 << 30,
    "4g": 4 << 30,
    "16g": 16 << 30,
    "64g": 64 << 30,
}
DEFAULT_DISK_LIMIT = 10 << 30  # settings.limits.disk_gb's default
SandboxState = Literal["running", "paused", "stopped", "absent"]
RecoveryAction = Literal["adopted", "restarted", "paused", "failed"]


@dataclass(frozen=True)
class Mount:
    """An extra read-only bind mount (skills, CA bundles)."""

    source: Path
    destination: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerSpec:
    """Everything needed to (re)create one container; stored beside it for recovery."""

    id: str
    memory_limit: MemoryLimit = "1g"
    pids_limit: int = 1024
    cpus: float = 1.0
    tmp_size_mb: int = 512
    disk_limit_bytes: int = DEFAULT_DISK_LIMIT  # upper layer and /mnt/data together
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    netns_path: str | None = None  # join this network namespace; None: a private loopback-only one
    hosts: Mapping[str, str] = field(default_factory=dict)  # extra /etc/hosts lines


@dataclass(frozen=True)
class ExecRequest:
    commands: list[str]
    timeout_ms: int
    max_output_length: int
    env: Mapping[str, str] | None = None  # added to the sandbox's clean environment
    cwd: str | None = None
    stream: bool = True


@dataclass(frozen=True)
class Outcome:
    type: Literal["exit", "timeout"]
    exit_code: int | None = None

    def to_wire(self) -> dict[str, object]:
        if self.type == "timeout":
            return {"type": "timeout"}
        return {"type": "exit", "exit_code": self.exit_code}


@dataclass(frozen=True)
class CommandResult:
    stdout: str
    stderr: str
    outcome: Outcome

    def to_wire(self) -> dict[str, object]:
        return {"stdout": self.stdout, "stderr": self.stderr, "outcome": self.outcome.to_wire()}


@dataclass(frozen=True)
class CommandStarted:
    command_index: int


@dataclass(frozen=True)
class OutputDelta:
    command_index: int
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class CommandFinished:
    command_index: int
    result: CommandResult


ExecEvent = CommandStarted | OutputDelta | CommandFinished


@dataclass(frozen=True)
class SnapshotTaken:
    """What taking a snapshot cost and holds."""

    bytes: int  # what the container's disk held when it was taken (what a fork starts with)
    frozen_s: float  # how long the container's processes were frozen for it (0: none ran)


@dataclass(frozen=True)
class SandboxInfo:
    id: str
    state: SandboxState


class Runtime(Protocol):
    """Creates, runs and removes sandbox containers. All methods are safe to call concurrently
    for different containers."""

    async def create(self, spec: ContainerSpec) -> None:
        """Lay out the container's disk (upper layer, data dir) and its cgroups."""

    async def start(self, container_id: str) -> None:
        """Start (or restart) the container; returns once its agent answers."""

    def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Run commands in order, yielding events as output arrives."""
        ...

    async def run(self, container_id: str, request: ExecRequest) -> list[CommandResult]:
        """Run commands and return one result per command."""
        ...

    async def pause(self, container_id: str) -> None:
        """Freeze every process (cgroup freezer): they keep their memory and use no CPU."""

    async def resume(self, container_id: str) -> None:
        """Thaw what ``pause`` froze."""

    async def snapshot(self, container_id: str, snapshot_id: str) -> SnapshotTaken:
        """Save the container's writable state (rootfs layer, /mnt/data; not /tmp) as a
        read-only snapshot; its processes are frozen only for the instant it takes."""
        ...

    async def fork(self, spec: ContainerSpec, snapshot_id: str) -> None:
        """``create``, with the disk a writable copy-on-write copy of a snapshot."""

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove a snapshot; forks made from it keep their files. Idempotent."""

    async def snapshot_ids(self) -> list[str]:
        """Every snapshot this runtime's storage holds."""
        ...

    async def stop(self, container_id: str) -> None:
        """Stop every process; the disk stays."""

    async def destroy(self, container_id: str) -> None:
        """Remove processes, cgroups, mounts and disk; idempotent."""

    async def state(self, container_id: str) -> SandboxState: ...

    async def list(self) -> list[SandboxInfo]:
        """Every container this runtime's state directory holds."""
        ...

    async def recover(self) -> dict[str, RecoveryAction]:
        """After the owning process died: adopt running containers whose agent answers,
        restart the others from their disk, clean up what destroyed ones left; returns what
        was done per container id ("adopted", "restarted", "paused" or "failed")."""
        ...

    def data_dir(self, container_id: str) -> Path:
        """Host path of the container's ``/mnt/data``."""
        ...
