"""What a sandbox runtime is: the ``Runtime`` protocol and the values it trades in.

A runtime is the "deployment" half (where a container lives: crun on this host today,
Kubernetes later); the in-container agent is the "runtime" half of SWE-ReX's split and is
reached through ``Runtime.exec``.

``Runtime`` is the whole way from the service layer to a sandbox: its lifecycle, its
commands, and its files under ``/mnt/data``. Everything crossing it is a value or a byte
stream (paths are relative to ``/mnt/data`` and already normalised by
``datapath.relative_path``; never a host path or a file descriptor), so a runtime on another
machine or in Kubernetes can implement it over the network.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from shellbox.patch import PatchOperation

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
    """A bind mount of a path on the runtime's own machine. Only the driver and its
    collaborators make these (the egress network's CA bundles, a test's extra mount); the
    service layer names what it wants by value (``skills``, ``files``, ``network``), so a
    remote runtime never receives a path of another machine."""

    source: Path
    destination: str
    read_only: bool = True


@dataclass(frozen=True)
class SkillMount:
    """A skill the runtime holds (``Runtime.install_skill``), mounted read-only."""

    key: str  # as installed: content-addressed by the skill version (or inline skill)
    destination: str  # absolute, in the container (``/mnt/skills/<name>``)


@dataclass(frozen=True)
class SecretInjection:
    """A secret the egress proxy puts in place of its placeholder, for one domain glob."""

    domain: str
    placeholder: str  # what the container sees (its environment holds it)
    value: str = field(repr=False)  # never in a repr, hence never in a log line


@dataclass(frozen=True)
class NetworkSpec:
    """An allowlist network: the container reaches the outside only through the egress
    proxy of the runtime's machine, to these domains, with these secrets injected. No
    ``allowed_domains``: a namespace of its own that reaches nothing yet (a pooled one)."""

    allowed_domains: tuple[str, ...] = ()
    secrets: tuple[SecretInjection, ...] = ()


@dataclass(frozen=True)
class NetworkAttachment:
    """What a ``SandboxNetwork`` gives a container: its namespace, the proxy's variables,
    and the files it mounts (paths on the runtime's own machine)."""

    netns_path: str
    env: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()


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
    skills: tuple[SkillMount, ...] = ()
    # Read-only single files, by value: destination in the container -> text (a skill index).
    files: Mapping[str, str] = field(default_factory=dict)
    # None: a private namespace with loopback only. Holds secrets: they go to the runtime's
    # ``SandboxNetwork`` (which keeps them sealed); the driver's copy of the spec has none.
    network: NetworkSpec | None = None
    hosts: Mapping[str, str] = field(default_factory=dict)  # extra /etc/hosts lines
    mounts: tuple[Mount, ...] = ()  # the driver's own (tests): never from the service layer


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


@dataclass(frozen=True)
class FileInfo:
    """A regular file under ``/mnt/data``."""

    path: str  # relative to /mnt/data
    size: int  # bytes
    mtime_ns: int


@dataclass(frozen=True)
class PatchResult:
    """What an ``apply_patch`` call did: all of it (``completed``) or nothing."""

    completed: bool
    output: str  # written for the model: what was done, or why nothing was


@dataclass(frozen=True)
class RuntimeInfo:
    """What a runtime says about itself (``/healthz``, the container object's ``image``)."""

    image_id: str  # ``<profile>-<recipe hash>``
    image_profile: str
    cgroup: str | None = None  # the host's cgroup layout (v2, hybrid, v1), if it has one
    disk_quota: str | None = None  # the kind of per-container disk quota, None: no quota


# A body to write: chunks from the caller, given in order. Sync iterables are read by the
# runtime (in a worker thread where it blocks); both may raise (a size cap) to abort the write.
ByteSource = Iterable[bytes] | AsyncIterable[bytes]


class SandboxNetwork(Protocol):
    """The driver's collaborator for containers with a ``NetworkSpec`` (the egress feature's
    namespaces and proxy, on the runtime's machine), injected into the driver by the
    composition root."""

    async def attach(
        self, container_id: str, network: NetworkSpec | None, image_rootfs: Path
    ) -> NetworkAttachment:
        """Give the container its namespace (the one it had, after a restart), and tell the
        proxy its policy; idempotent, and a changed policy applies at once. ``network``
        None: the policy it was given last (the driver keeps no secret value itself: they
        are the network's to keep, sealed)."""
        ...

    def env(self, container_id: str) -> Mapping[str, str]:
        """The proxy variables of an attached container (empty if it has none)."""
        ...

    async def detach(self, container_id: str) -> None:
        """Forget the container's policy and tear its namespace down; idempotent."""


class Runtime(Protocol):
    """Creates, runs and removes sandbox containers, and reads and writes their files. All
    methods are safe to call concurrently for different containers.

    Errors are domain errors (``shellbox.errors``): ``ContainerNotFound`` for an id the
    runtime does not hold, ``FileNotFound``/``InvalidRequest``/``PathOutsideWorkspace``
    naming ``param`` for a path, ``DiskQuotaExceeded`` for a full disk, ``SandboxError`` for
    the runtime's own failures."""

    # -- lifecycle ------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> None:
        """Lay out the container's disk (upper layer, data dir) and its cgroups."""

    async def update(self, spec: ContainerSpec) -> None:
        """Replace a created container's spec: ``env`` applies from the next command and
        ``disk_limit_bytes`` at once; everything else from its next start."""

    async def start(self, container_id: str) -> None:
        """Start (or restart) the container; returns once its agent answers."""

    async def responsive(self, container_id: str) -> bool:
        """Whether the container's agent answers now (a cheap round trip, nothing run)."""
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

    def describe(self) -> RuntimeInfo:
        """The image containers run and the host facilities they get."""
        ...

    async def image_file(self, path: str) -> bytes | None:
        """The bytes of an absolute ``path`` in the sandbox image (None: no such file)."""
        ...

    # -- skills (read-only trees the runtime keeps; ``ContainerSpec.skills`` mounts them) ---

    async def install_skill(self, key: str, archive: ByteSource) -> bool:
        """Keep a skill's files (``archive``: a tar of them) under ``key``; idempotent and
        content-addressed: a key already held is kept and ``archive`` is not read. Returns
        whether it was installed now."""
        ...

    async def skill_keys(self) -> builtins.list[str]:
        """Every skill key this runtime holds."""
        ...

    async def remove_skill(self, key: str) -> None:
        """Remove a skill's files (the containers that mount it are gone); idempotent."""

    # -- commands -------------------------------------------------------------------------

    def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        """Run commands in order, yielding events as output arrives."""
        ...

    async def run(self, container_id: str, request: ExecRequest) -> builtins.list[CommandResult]:
        """Run commands and return one result per command."""
        ...

    # -- files under /mnt/data (``rel``: relative to it, normalised) ------------------------
    # A stopped container's files are reachable too: none of these starts it.

    async def read_file(
        self, container_id: str, rel: str, *, follow_links: bool = False, param: str = "path"
    ) -> AsyncIterator[bytes]:
        """The regular file's bytes. Opened before this returns (a missing file raises
        here, not while streaming). Symbolic links on the path are refused, or with
        ``follow_links`` followed as the container would, while they stay in /mnt/data."""
        ...

    async def write_file(
        self,
        container_id: str,
        rel: str,
        chunks: ByteSource,
        *,
        follow_links: bool = False,
        param: str = "path",
    ) -> tuple[str, int]:
        """Replace (or create, with its missing parent directories) a file owned by the
        sandbox user, atomically: a body that fails leaves nothing behind. Returns where it
        was written (``rel`` with links followed) and its size."""
        ...

    async def stat_file(self, container_id: str, rel: str) -> FileInfo | None:
        """The regular file at ``rel`` (links not followed); None for anything else."""
        ...

    async def list_files(self, container_id: str) -> builtins.list[FileInfo]:
        """Every regular file under /mnt/data (bounded: the deepest and the most numerous
        are left out), none of the runtime's own temporaries."""
        ...

    async def remove_file(self, container_id: str, rel: str, *, param: str = "path") -> None:
        """Delete the file (a link itself, never what it points at); FileNotFound if none."""

    async def resolve_path(self, container_id: str, rel: str, *, param: str = "path") -> str:
        """``rel`` with its symbolic links followed (``""``: /mnt/data itself);
        PathOutsideWorkspace if one leads out of /mnt/data."""
        ...

    async def apply_patch(
        self, container_id: str, operations: Sequence[PatchOperation]
    ) -> PatchResult:
        """Apply V4A operations all or nothing, with the sandbox user's permissions; a
        failure the model can fix is a result, not an error."""
        ...

    async def export_archive(
        self, container_id: str, rel_dir: str, exclude: Sequence[str], *, timeout_ms: int
    ) -> AsyncIterator[bytes]:
        """A tar of the directory (``""``: /mnt/data), members ``./...``, made inside the
        running container by the sandbox user within ``timeout_ms``; ``exclude`` holds
        member names (``./a/b``). The tree is left as it was (directory times included)."""
        ...

    async def import_archive(
        self, container_id: str, rel_dir: str, body: ByteSource, *, timeout_ms: int
    ) -> int:
        """Unpack a tar under the directory (created if missing) inside the running
        container, as the sandbox user, within ``timeout_ms``; returns the archive's size."""
        ...

    async def sweep_uploads(self, container_id: str) -> int:
        """Remove partial writes a crashed server left in the container; returns how many."""
        ...
