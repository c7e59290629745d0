"""``OciRuntime``: sandbox containers with crun (default) or runc, on this host.

Disk layout under the state directory, per container ``<state>/containers/<id>/``:

    spec.json   the ContainerSpec, to recreate the bundle after a restart (0600; a network's
                secret values left out: its ``SandboxNetwork`` keeps them, sealed)
    files/      the spec's read-only files by value (a skill index), written at each start
    config.json the OCI bundle config (rewritten at every start)
    rootfs/     the overlay mount point (mounted only inside the container's namespace)
    agent.log   the agent's stdout/stderr

and its disk, ``<state>/disks/<id>/``, a btrfs subvolume with the container's disk quota
(``storage.py``):

    upper/ work/  the overlay's private layer (the shared image is the lower layer)
    data/       bind-mounted at /mnt/data; the host reads and writes container files here

Containers made before disks existed keep ``upper/ work/ data/`` in their container
directory, and run without a disk quota. Both directories are root's with the group of the
container's root (its own uid range, ``idmap.py``), mode 0710: it can reach its rootfs and
data, no other container's uids can look in. ``upper/`` and ``data/`` are owned by the range.

Volatile pieces live in ``/run/shellbox/<hash of state dir>/`` (short paths: a Unix socket
path must fit in 108 bytes): the OCI runtime's own state and each container's socket
directory, mode 0700 and owned by the container's root, so uid 1000 inside cannot reach the
agent.

The overlay is mounted in a private mount namespace made just for the ``crun run`` call, so
the mount exists only inside the container and disappears with it: a crash of the server
can never leave a mount behind on the host. On hybrid cgroup hosts the same namespace
replaces ``/sys/fs/cgroup/unified``, without which crun 1.8 refuses to start anything (see
``hostns.py``).

Where a start's time goes, and what is done about it (medians on this kind of machine):

* crun compiles the JSON seccomp profile on every start (~25 ms): the filter it compiled for
  the first container is kept under ``<state>/cache/`` and handed to later ones precompiled
  (crun's ``run.oci.seccomp_bpf_data`` annotation);
* the host binds the agent's socket and passes it in as fd 3: the first request is queued
  in the backlog while the agent starts, so nobody polls for readiness;
* the agent imports only C modules and its byte code is precompiled (``server.py``);
* the owning process enters a private mount namespace once (``hostns.py``), so an OCI call
  is a plain ``vfork``+``exec``, not ``unshare``/``sh``/``mount`` programs (~8 ms) nor a
  ``fork()`` of a large server process (~2-6 ms).

The process that owns an ``OciRuntime`` can die at any time: containers run detached, and a
new ``OciRuntime`` on the same state directory finds them (``list``), adopts those whose
agent answers and restarts the others with their files (``recover``).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import py_compile
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from importlib.util import cache_from_source
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.abc import ByteStream

from shellbox.agent import client as agent_client
from shellbox.agent import protocol, pty_client
from shellbox.errors import (
    AgentNotReachable,
    AgentOutdated,
    AgentUnavailable,
    Conflict,
    ContainerNotFound,
    InvalidRequest,
    PortNotListening,
    SandboxError,
    ShellboxError,
)
from shellbox.patch import PatchOperation
from shellbox.sandbox import hostns, idmap, oci, storage
from shellbox.sandbox.base import (
    ByteSource,
    CommandFinished,
    CommandResult,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    FileInfo,
    Mount,
    NetworkAttachment,
    NetworkSpec,
    Outcome,
    PatchResult,
    PtyRequest,
    PtySession,
    RecoveryAction,
    Runtime,
    RuntimeInfo,
    SandboxInfo,
    SandboxNetwork,
    SandboxState,
    SnapshotTaken,
)
from shellbox.sandbox.cgroups import CgroupMode, HostCgroups, detect_mode
from shellbox.sandbox.host_files import HostFiles, sync_chunks
from shellbox.sandbox.netns_dial import Netns, NetnsDialer, open_netns
from shellbox.sandbox.run_dirs import RUN_BASE, run_base_for
from shellbox.sandbox.skill_layouts import SkillLayouts, check_key
from shellbox.sandbox.socket_stream import SocketByteStream
from shellbox.sandbox.wire import spec_from_json, spec_to_json

log = logging.getLogger("shellbox.sandbox")
AGENT_SOURCE = Path(__file__).resolve().parent.parent / "agent"
AGENT_FILES = ("server.py", "protocol.py")
RUN_KEY = re.compile(r"[0-9a-f]{12}")  # run_base's name: the start of the state dir's sha256
# A live agent that has not answered yet. One that died answers at once (the last copy of its
# listening socket closes with it and the ping reads EOF), so this bounds only a slow or hung
# one, and must be long: on a loaded host (load average 100-400) starting Python in a new
# container can take over 10 s, and a create then answered 500 for an agent starting fine.
AGENT_START_TIMEOUT_S = 60.0
PF_EXITING = 0x4  # <linux/sched.h>: a task's flags while it exits
# How ``crun exec`` gets a command: on stdin, never as argv (one argv string is capped at
# 128 KiB, a command may be 1 MiB). bash reads it whole from the pipe (``cat``: the sandbox
# user may not reopen a pipe made outside its user namespace through /dev/fd), gives the
# command /dev/null as stdin (the contract), and evaluates it.
FALLBACK_SCRIPT = (
    'exec 3<&0 </dev/null; __shellbox_command="$(cat <&3)"; exec 3<&-; '
    'eval "unset __shellbox_command; $__shellbox_command"'
)


OWNER_FILE = "owner"  # the state directory a /run/shellbox/<key> directory belongs to


def sweep_stale_run_dirs(
    base: Path, cgroups: HostCgroups, *, keep: Path | None = None
) -> list[Path]:
    """Remove ``/run/shellbox/<key>`` directories left by state directories that are gone.

    Such a directory is only volatile state (OCI runtime state, agent socket directories), but
    every test run or throwaway state directory would otherwise leave one behind. One whose
    OCI runtime still records containers goes too when its owner is recorded and gone, with
    those containers' cgroups, if no process is left in them: no server can serve them
    again (a server killed and its state directory removed). Cgroups are shared by every
    state directory on the host, and these are provably this directory's: named by its OCI
    state. One with a process left, or with no owner recorded, is kept.
    """
    removed: list[Path] = []
    if not base.is_dir():
        return removed
    for run_dir in base.iterdir():
        # Only the per-state-directory ones: others live here too (egress-slots, the
        # host-wide slot claims of every server, must never go).
        if run_dir == keep or not run_dir.is_dir() or not RUN_KEY.fullmatch(run_dir.name):
            continue
        if remove_stale_run_dir(run_dir, cgroups):
            removed.append(run_dir)
    return removed


def remove_stale_run_dir(run_dir: Path, cgroups: HostCgroups) -> bool:
    """Remove one ``/run/shellbox/<key>`` directory if its state directory is gone (see
    ``sweep_stale_run_dirs``), with its dead containers' cgroups; False if it is kept."""
    owner = run_dir / OWNER_FILE
    try:
        if Path(owner.read_text().strip()).is_dir():
            return False
        owned = True
    except OSError:
        owned = False  # no owner recorded: decided by the OCI state alone
    recorded = {
        p.name
        for oci_binary in ("crun", "runc")
        if (run_dir / oci_binary).is_dir()
        for p in (run_dir / oci_binary).iterdir()
    }
    if recorded and not (owned and _remove_dead_cgroups(cgroups, recorded, run_dir)):
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True


def _remove_dead_cgroups(cgroups: HostCgroups, ids: set[str], run_dir: Path) -> bool:
    """Remove the cgroups of containers whose state directory is gone; False if any holds a
    process still (kept, and said: something of a removed state directory runs on)."""
    alive = []
    for cid in sorted(ids):
        try:
            if not cgroups.remove_if_empty(cid):
                alive.append(cid)
        except OSError as exc:
            log.warning("removing the cgroups of %s (of %s) failed: %s", cid, run_dir, exc)
            alive.append(cid)
    if alive:
        log.warning(
            "%s belongs to a state directory that is gone, but processes of %s still run; kept",
            run_dir,
            ", ".join(alive),
        )
    return not alive


class OciRuntime:
    """A ``Runtime`` backed by an OCI runtime binary on this host."""

    def __init__(
        self,
        state_dir: Path,
        image_rootfs: Path,
        *,
        binary: Literal["crun", "runc"] = "crun",
        seccomp: bool = True,
        sandbox_env: dict[str, str] | None = None,
        storage_config: storage.StorageConfig | None = None,
        uid_ranges: idmap.UidRanges | None = None,
        network: SandboxNetwork | None = None,
    ) -> None:
        self.state_dir = state_dir.resolve()
        # Namespaces and the egress proxy for containers with a ``NetworkSpec`` (None: such
        # containers are refused).
        self.network = network
        self.uid_ranges = uid_ranges or idmap.UidRanges()
        self.uid_ranges.check_host()
        self._uid_bases: dict[str, int] = {}
        self.image_rootfs = image_rootfs
        self.binary = binary
        self.binary_path = shutil.which(binary)
        if self.binary_path is None:
            msg = f"{binary} is not installed; run ./scripts/setup.sh"
            raise SandboxError(msg)
        self.cgroups = HostCgroups(detect_mode())
        log.info("cgroup layout: %s", self.cgroups.describe())
        # Once per process, while it has no threads: OCI calls then need no namespace set-up.
        hostns.enter_private_namespace(
            self.cgroups.mode is CgroupMode.hybrid, self.uid_ranges.count
        )
        hostns.make_room_for(self.uid_ranges.count)
        self.seccomp = oci.load_seccomp() if seccomp else None
        self.run_base = run_base_for(self.state_dir)
        self.oci_root = self.run_base / binary
        sweep_stale_run_dirs(RUN_BASE, self.cgroups, keep=self.run_base)
        self.containers_dir = self.state_dir / "containers"
        self.cache_dir = self.state_dir / "cache"
        self.containers_dir.mkdir(parents=True, exist_ok=True)
        hostns.keep_mounts_under(str(self.containers_dir))  # overlay roots stay ours
        # After the namespace is ours: the disks' filesystem is mounted there, not on the host.
        config = storage_config or storage.StorageConfig()
        self.storage = storage.open_storage(self.state_dir, config)
        self._disk_dirs: dict[str, Path] = {}
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.oci_root.mkdir(parents=True, exist_ok=True)
        (self.run_base / OWNER_FILE).write_text(str(self.state_dir))
        self.agent_dir = self._install_agent()
        self.base_env = {
            "PATH": oci.SANDBOX_PATH,
            "HOME": "/home/user",
            "USER": "user",
            "LOGNAME": "user",
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(sandbox_env or {}),
        }
        self._locks: dict[str, asyncio.Lock] = {}
        self._spec_env: dict[str, dict[str, str]] = {}
        self._seccomp_bpf = self._load_seccomp_bpf()
        self.files = HostFiles(
            self.data_dir, lambda cid: self.host_uid(cid, oci.SANDBOX_UID), self.run
        )
        self.skills = SkillLayouts(self.state_dir / "skill-layouts")
        self.skills.clear_staging()  # what an install cut short by a crash left
        self._dialer = NetnsDialer()
        self._netns: dict[str, Netns] = {}  # by container id: its agent's, held open

    # -- paths ------------------------------------------------------------------------------

    def container_dir(self, container_id: str) -> Path:
        if not container_id or "/" in container_id or container_id.startswith("."):
            msg = f"no such container: {container_id!r}"
            raise ContainerNotFound(msg)
        return self.containers_dir / container_id

    def disk_dir(self, container_id: str) -> Path:
        """Where the container's ``upper/``, ``work/`` and ``data/`` are."""
        known = self._disk_dirs.get(container_id)
        if known is not None:
            return known
        cdir = self.container_dir(container_id)
        disk = self.storage.path(container_id)
        if not disk.is_dir() and (cdir / "data").is_dir():
            disk = cdir  # made before disks existed: no quota
        elif not disk.is_dir():
            return disk  # not made (yet): remember nothing
        self._disk_dirs[container_id] = disk
        return disk

    def data_dir(self, container_id: str) -> Path:
        return self.disk_dir(container_id) / "data"

    def disk_usage(self, container_id: str) -> int | None:
        """Bytes the container's disk holds against its quota (None: it has no quota)."""
        return self.storage.usage(container_id)

    def socket_dir(self, container_id: str) -> Path:
        return self.run_base / "sock" / container_id

    def socket_path(self, container_id: str) -> Path:
        return self.socket_dir(container_id) / protocol.SOCKET_NAME

    def _lock(self, container_id: str) -> asyncio.Lock:
        return self._locks.setdefault(container_id, asyncio.Lock())

    def uid_base(self, container_id: str) -> int:
        """The host uid of the container's root: the first of its own range (``idmap.py``);
        ``IMAGE_UID_BASE`` for a container made before ranges existed."""
        base = self._uid_bases.get(container_id)
        if base is None:
            base = idmap.read_base(self.container_dir(container_id))
            if base is None:
                if not (self.container_dir(container_id) / "spec.json").exists():
                    msg = f"no such container: {container_id}"
                    raise ContainerNotFound(msg)
                base = idmap.IMAGE_UID_BASE
            self._uid_bases[container_id] = base
        return base

    def host_uid(self, container_id: str, container_uid: int) -> int:
        """The host uid that ``container_uid`` is inside the container (file ownership)."""
        return self.uid_base(container_id) + container_uid

    def _install_agent(self) -> Path:
        """Copy the agent's files, with their byte code, where the container's root can read
        them. The directory is named by a hash of the sources, so it never changes once made."""
        blob = b"".join((AGENT_SOURCE / f).read_bytes() for f in AGENT_FILES)
        blob += sys.implementation.cache_tag.encode()
        target = self.state_dir / "agent" / hashlib.sha256(blob).hexdigest()[:12]
        if not (target / "complete").exists():
            tmp = target.with_name(f".{target.name}-{os.getpid()}-{threading.get_ident()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for f in AGENT_FILES:
                shutil.copyfile(AGENT_SOURCE / f, tmp / f)
                os.chmod(tmp / f, 0o644)
                # The container's python3 (3.11 in the image) uses these when its version
                # matches the host's, and compiles in memory otherwise. The directory is
                # content-addressed, so the sources need no re-check.
                pyc = Path(cache_from_source(str(tmp / f)))
                py_compile.compile(
                    str(tmp / f),
                    cfile=str(pyc),
                    dfile=f"{oci.AGENT_DIR}/{f}",
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
                os.chmod(pyc, 0o644)
            os.chmod(tmp / "__pycache__", 0o755)
            (tmp / "complete").touch()
            os.chmod(tmp, 0o755)
            os.chmod(tmp.parent, 0o755)
            try:
                tmp.rename(target)
            except OSError:  # another process installed it first
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    # -- seccomp, precompiled ---------------------------------------------------------------

    def _seccomp_key(self) -> str | None:
        if self.seccomp is None or self.binary != "crun":
            return None
        st = os.stat(self.binary_path or self.binary)  # a new crun compiles anew
        blob = json.dumps([self.seccomp, st.st_size, st.st_mtime_ns], sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def _load_seccomp_bpf(self) -> bytes | None:
        key = self._seccomp_key()
        if key is None:
            return None
        try:
            data = (self.cache_dir / f"seccomp-{key}.bpf").read_bytes()
        except FileNotFoundError:
            return None
        return data if data and len(data) % 8 == 0 else None

    def _save_seccomp_bpf(self, container_id: str) -> None:
        """Keep the filter crun compiled for this container, for every later start."""
        key = self._seccomp_key()
        if key is None or self._seccomp_bpf is not None:
            return
        try:
            data = (self.oci_root / container_id / "seccomp.bpf").read_bytes()
        except OSError:
            return
        if not data or len(data) % 8:
            return
        target = self.cache_dir / f"seccomp-{key}.bpf"
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        tmp.write_bytes(data)
        tmp.rename(target)
        self._seccomp_bpf = data

    # -- lifecycle --------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> None:
        await self._create(spec, None)

    async def fork(self, spec: ContainerSpec, snapshot_id: str) -> None:
        """A new container whose disk is a writable snapshot of ``snapshot_id``.

        The snapshot's files belong to the uid range of the container it was taken from; the
        fork has a range of its own, so every inode is chowned from the old range to the new
        one (metadata only: no data extent is copied, but the cost grows with the number of
        files, ~10 us each). An id-mapped mount of the data instead would be O(1) but would
        leave the fork's files owned on disk by its origin's uids."""
        await self._create(spec, snapshot_id)

    async def _create(self, spec: ContainerSpec, snapshot_id: str | None) -> None:
        cdir = self.container_dir(spec.id)
        (cdir / "rootfs").mkdir(parents=True, exist_ok=True)
        root_uid = idmap.read_base(cdir)
        if root_uid is None:
            try:
                root_uid = self.uid_ranges.claim(cdir)
            except ShellboxError:
                shutil.rmtree(cdir, ignore_errors=True)
                raise
            idmap.write_base(cdir, root_uid)
        self._uid_bases[spec.id] = root_uid
        # The container's root must traverse it to its rootfs and data; no other container's
        # uids (an escaped process) may even look in.
        os.chown(cdir, 0, root_uid)
        os.chmod(cdir, 0o710)
        if snapshot_id is None:
            disk = self.storage.create(spec.id, spec.disk_limit_bytes)
        else:
            try:
                disk = await asyncio.to_thread(
                    self.storage.fork, snapshot_id, spec.id, spec.disk_limit_bytes
                )
                origin = os.stat(disk / "upper").st_uid  # owned by its origin's root
                if origin != root_uid:
                    await asyncio.to_thread(idmap.shift_tree, disk, origin, root_uid)
            except BaseException:
                await asyncio.to_thread(self.storage.remove, spec.id)
                shutil.rmtree(cdir, ignore_errors=True)
                self.uid_ranges.release(root_uid, cdir)
                raise
        os.chown(disk, 0, root_uid)  # the same for the disk, a directory of its own
        os.chmod(disk, 0o710)
        for sub in ("upper", "work", "data"):
            (disk / sub).mkdir(exist_ok=True)
        os.chown(disk / "upper", root_uid, root_uid)
        os.chmod(disk / "upper", 0o755)
        sandbox_uid = root_uid + oci.SANDBOX_UID
        os.chown(disk / "data", sandbox_uid, sandbox_uid)
        os.chmod(disk / "data", 0o755)
        self._disk_dirs[spec.id] = disk
        _write_spec(cdir, spec)
        self._spec_env.pop(spec.id, None)
        if spec.network is not None:  # its namespace is taken now, as the pool's containers'
            await self._attach(spec.id, spec, spec.network)

    def load_spec(self, container_id: str) -> ContainerSpec:
        path = self.container_dir(container_id) / "spec.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            msg = f"no such container: {container_id}"
            raise ContainerNotFound(msg) from None
        return spec_from_json(raw)

    async def update(self, spec: ContainerSpec) -> None:
        """Replace the stored spec (used on the next start); a new disk limit applies now,
        ``env`` from the next command (it is handed to each command, not to the container)."""
        self._spec_env.pop(spec.id, None)
        old = self.load_spec(spec.id)
        if old.disk_limit_bytes != spec.disk_limit_bytes:
            self.storage.set_limit(spec.id, spec.disk_limit_bytes)
        _write_spec(self.container_dir(spec.id), spec)
        if spec.network != old.network:  # a policy applies at once (a pooled one taken)
            # (``old`` has no secret values: any network with secrets is given again)
            if spec.network is not None:
                await self._attach(spec.id, spec, spec.network)
            elif self.network is not None:
                await self.network.detach(spec.id)

    async def start(self, container_id: str) -> None:
        """Start the container, or adopt it when it already runs and its agent answers in
        this protocol version (one started by another shellbox version is started again)."""
        async with self._lock(container_id):
            spec = self.load_spec(container_id)
            # An adopted container too: after a restart its proxy and policy are not up yet.
            attachment = await self._attach(container_id, spec)
            state = await self.state(container_id)
            if state == "running":
                try:
                    await agent_client.ping(self.socket_path(container_id))
                    return
                except AgentOutdated as exc:
                    log.warning("sandbox %s: %s; starting it again", container_id, exc)
                except (AgentUnavailable, OSError, ValueError):
                    pass
            if state != "absent":
                await self._remove_oci(container_id)
            await self._start(spec, attachment)

    async def _attach(
        self, container_id: str, spec: ContainerSpec, given: NetworkSpec | None = None
    ) -> NetworkAttachment | None:
        """The container's network, if it has one: ``given`` (a new policy), else the one it
        was given last."""
        if spec.network is None:
            return None
        if self.network is None:
            msg = f"container {container_id} has a network policy, and this runtime no network"
            raise SandboxError(msg)
        attachment = await self.network.attach(container_id, given, self.image_rootfs)
        self._spec_env.pop(container_id, None)
        return attachment

    def _mounts(
        self, spec: ContainerSpec, cdir: Path, attachment: NetworkAttachment | None
    ) -> tuple[Mount, ...]:
        """The spec's mounts, its skills and files (by value) and its network's, as host paths."""
        mounts = list(spec.mounts)
        for skill in spec.skills:
            source = self.skills.path(skill.key)
            if not source.is_dir():
                msg = f"skill {skill.key} is not installed on this runtime"
                raise SandboxError(msg)
            mounts.append(Mount(source, skill.destination))
        files_dir = cdir / "files"
        shutil.rmtree(files_dir, ignore_errors=True)
        if spec.files:
            files_dir.mkdir()
            os.chmod(files_dir, 0o711)
            for i, (destination, text) in enumerate(sorted(spec.files.items())):
                path = files_dir / str(i)
                path.write_text(text)
                os.chmod(path, 0o644)
                mounts.append(Mount(path, destination))
        if attachment is not None:
            mounts.extend(attachment.mounts)
        return tuple(mounts)

    async def _start(self, spec: ContainerSpec, attachment: NetworkAttachment | None) -> None:
        container_id = spec.id
        cdir = self.container_dir(container_id)
        disk = self.disk_dir(container_id)
        sock_dir = self.socket_dir(container_id)
        sock_dir.mkdir(parents=True, exist_ok=True)
        root_uid = self.uid_base(container_id)
        self.uid_ranges.hold(root_uid, cdir)
        os.chown(sock_dir, root_uid, root_uid)
        os.chmod(sock_dir, 0o700)
        sock_path = sock_dir / protocol.SOCKET_NAME
        sock_path.unlink(missing_ok=True)
        self.cgroups.prepare(container_id, root_uid)
        hosts_file = None
        if spec.hosts:
            hosts_file = cdir / "hosts"
            hosts_file.write_text(oci.hosts_file_text(spec.hosts))
            os.chmod(hosts_file, 0o644)
        config = oci.build_config(
            dataclasses.replace(spec, mounts=self._mounts(spec, cdir, attachment)),
            rootfs=cdir / "rootfs",
            data_dir=disk / "data",
            run_dir=sock_dir,
            agent_dir=self.agent_dir,
            cgroups_path=self.cgroups.cgroups_path(container_id),
            uid_base=root_uid,
            seccomp=self.seccomp,
            seccomp_bpf=self._seccomp_bpf,
            hosts_file=hosts_file,
            netns_path=attachment.netns_path if attachment is not None else None,
        )
        (cdir / "config.json").write_text(json.dumps(config))
        rootfs = str(cdir / "rootfs")
        # The image, id-mapped to the container's range, is mounted at rootfs first and is the
        # lower layer of the overlay mounted on top of it (the image's own range needs none).
        image_base = 0 if root_uid == idmap.IMAGE_UID_BASE else root_uid
        lower = rootfs if image_base else str(self.image_rootfs)
        overlay = f"lowerdir={lower},upperdir={disk / 'upper'},workdir={disk / 'work'}"
        # Socket activation: bound and listening before the agent exists. It reaches the agent
        # as crun's stdin, which a detached container inherits (the agent moves it off fd 0).
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mounted = 0
        try:
            listener.bind(str(sock_path))
            os.chmod(sock_path, 0o600)
            listener.listen(128)
            ns = hostns.Namespace(hybrid=self.cgroups.mode is CgroupMode.hybrid)
            if hostns.in_private_namespace():
                if image_base:
                    idmap.mount_image(str(self.image_rootfs), rootfs, image_base)
                    mounted += 1
                try:
                    hostns.mount_overlay(rootfs, overlay)
                except OSError as exc:
                    if exc.errno != errno.EDQUOT:
                        raise
                    # A full disk under regular qgroups: mounting remakes the work directory.
                    with self.storage.lifted(container_id, spec.disk_limit_bytes):
                        hostns.mount_overlay(rootfs, overlay)
                mounted += 1
            else:
                ns = dataclasses.replace(
                    ns,
                    overlay_options=overlay,
                    overlay_target=rootfs,
                    image=str(self.image_rootfs) if image_base else "",
                    image_base=image_base,
                )
            with open(cdir / "agent.log", "wb+") as log:  # handed to the container
                await self._oci(
                    "run", "--detach", "--bundle", str(cdir), container_id,
                    ns=ns, stdin=listener.fileno(), stdio=log.fileno(),
                )  # fmt: skip
        finally:
            listener.close()
            for _ in range(mounted):  # the container has its own copy now
                hostns.detach(rootfs)
        try:
            await asyncio.wait_for(agent_client.ping(sock_path), timeout=AGENT_START_TIMEOUT_S)
        except (AgentUnavailable, OSError, ValueError, TimeoutError) as exc:
            tail = _tail(cdir / "agent.log")
            msg = f"the sandbox agent of {container_id} did not start: {exc}" + (
                f"; its log ends with: {tail}" if tail else ""
            )
            raise AgentUnavailable(msg) from None
        self._save_seccomp_bpf(container_id)

    async def pause(self, container_id: str) -> None:
        """The cgroup freezer, written directly (``crun state`` then says "paused")."""
        await asyncio.to_thread(self._freeze, container_id, True)

    async def resume(self, container_id: str) -> None:
        # A container frozen across a restart finds its proxy and policy up again.
        with contextlib.suppress(ContainerNotFound):
            await self._attach(container_id, self.load_spec(container_id))
        await asyncio.to_thread(self._freeze, container_id, False)

    def _freeze(self, container_id: str, frozen: bool) -> None:
        try:
            self.cgroups.freeze(container_id, frozen)
        except FileNotFoundError:
            msg = f"container {container_id} has no processes to {'pause' if frozen else 'resume'}"
            raise SandboxError(msg) from None

    async def snapshot(self, container_id: str, snapshot_id: str) -> SnapshotTaken:
        """Freeze a running container, snapshot its disk, thaw it. Frozen, no process can be
        half-way through a sequence of writes the snapshot would cut; the snapshot ioctl
        flushes the disk's dirty pages and is O(1), so the freeze lasts a few milliseconds
        (``bench/bench_snapshots.py`` measures it). A paused or stopped container is taken
        as it is."""
        self.storage.check_snapshots()
        async with self._lock(container_id):
            self.disk_dir(container_id)  # 404 for an unknown id
            frozen_s = 0.0
            if await self.state(container_id) == "running":
                # Written-back before the freeze, so the snapshot has little left to flush.
                await asyncio.to_thread(self.storage.sync, container_id)
                frozen_s = await asyncio.to_thread(self._frozen_snapshot, container_id, snapshot_id)
            else:
                await asyncio.to_thread(self.storage.snapshot, container_id, snapshot_id)
        held = await asyncio.to_thread(self.storage.usage, container_id)
        own = self.storage.quota_mode == "simple"
        return SnapshotTaken(bytes=held or 0, frozen_s=frozen_s, own_writes_only=own)

    def _frozen_snapshot(self, container_id: str, snapshot_id: str) -> float:
        """Freeze, snapshot, thaw, in one thread (nothing else is scheduled between);
        returns how long the processes were frozen, in seconds."""
        started = time.perf_counter()
        self.cgroups.freeze(container_id, True)
        try:
            self.storage.snapshot(container_id, snapshot_id)
        finally:
            self.cgroups.freeze(container_id, False)
        return time.perf_counter() - started

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(self.storage.remove_snapshot, snapshot_id)

    async def snapshot_ids(self) -> builtins.list[str]:
        return self.storage.snapshot_ids()

    async def stop(self, container_id: str) -> None:
        async with self._lock(container_id):
            await self._remove_oci(container_id)

    async def destroy(self, container_id: str) -> None:
        async with self._lock(container_id):
            await self._remove_oci(container_id)
            cdir = self.container_dir(container_id)
            base = idmap.read_base(cdir) if cdir.exists() else None
            await asyncio.to_thread(self.storage.remove, container_id)
            self._disk_dirs.pop(container_id, None)
            if cdir.exists():
                await asyncio.to_thread(shutil.rmtree, cdir, True)
            if base is not None:  # after the files it owns are gone
                self.uid_ranges.release(base, cdir)
            shutil.rmtree(self.socket_dir(container_id), ignore_errors=True)
            if self.network is not None:
                await self.network.detach(container_id)
        self._locks.pop(container_id, None)
        self._uid_bases.pop(container_id, None)
        self._spec_env.pop(container_id, None)
        self.files.forget(container_id)

    async def _remove_oci(self, container_id: str) -> None:
        """Kill every process and remove the OCI container and its cgroups; keep the disk."""
        self._forget_netns(container_id)
        if await self.state(container_id) != "absent":
            if self.binary == "runc":  # runc's delete -f is slow; kill + delete is not
                await self._oci("kill", container_id, "KILL", check=False)
            await self._oci("delete", "--force", container_id, check=False)
        await asyncio.to_thread(self.cgroups.remove, container_id)
        hostns.forget_unified(container_id)
        self.socket_path(container_id).unlink(missing_ok=True)

    async def state(self, container_id: str) -> SandboxState:
        if not (self.oci_root / container_id).exists():  # never started, or deleted
            return "absent"
        info = await self._oci_state(container_id)
        status = info.get("status") if info else None
        if status is None:
            return "absent"
        if status == "running":
            return "running"
        if status == "paused":
            return "paused"
        return "stopped"

    async def _oci_state(self, container_id: str) -> dict[str, Any] | None:
        out = await self._oci("state", container_id, check=False, capture=True)
        if not out:
            return None
        try:
            info = json.loads(out)
        except json.JSONDecodeError:
            return None
        return info if isinstance(info, dict) else None

    async def agent_pid(self, container_id: str) -> int | None:
        """The host pid of the container's PID 1 (the agent), if it runs."""
        if not (self.oci_root / container_id).exists():
            return None
        info = await self._oci_state(container_id)
        pid = info.get("pid") if info else None
        return pid if isinstance(pid, int) and pid > 0 else None

    async def list(self) -> list[SandboxInfo]:
        ids = sorted(p.name for p in self.containers_dir.iterdir() if (p / "spec.json").exists())
        states = await asyncio.gather(*(self.state(cid) for cid in ids))
        return [SandboxInfo(cid, state) for cid, state in zip(ids, states, strict=True)]

    async def recover(self) -> dict[str, RecoveryAction]:
        """After the owning process died (cleanly or not): take every container back.

        A running container whose agent answers is adopted as it is (its processes and
        background services keep running); any other one (stopped, absent after a reboot,
        with a hung agent, or with an agent of another protocol version: one an older
        shellbox started) is started again from its disk, files intact. Paused containers
        stay paused. Leftovers of destroyed containers (cgroups, socket directories, OCI
        state) are removed. Returns what was done for each container id.
        """
        done: dict[str, RecoveryAction] = {}
        for info in await self.list():
            if info.state == "paused":
                done[info.id] = "paused"
                continue
            adopted = False
            if info.state == "running":
                try:
                    await agent_client.ping(self.socket_path(info.id))
                    adopted = True
                except (AgentUnavailable, OSError, ValueError):
                    pass
            if adopted:
                done[info.id] = "adopted"
                continue
            try:
                await self.start(info.id)
                done[info.id] = "restarted"
            except Exception:  # one broken container must not stop the others
                log.exception("recovering sandbox %s: starting it again failed", info.id)
                done[info.id] = "failed"
        await self.sweep_orphans()
        return done

    async def sweep_orphans(self) -> builtins.list[str]:
        """Remove OCI state, cgroups, socket directories and disks of containers that have no
        spec (their destroy was interrupted). Returns the ids cleaned up."""
        known = {p.name for p in self.containers_dir.iterdir() if (p / "spec.json").exists()}
        orphans: set[str] = set()
        if self.oci_root.is_dir():
            orphans |= {p.name for p in self.oci_root.iterdir() if p.is_dir()} - known
        sock_root = self.run_base / "sock"
        if sock_root.is_dir():
            orphans |= {p.name for p in sock_root.iterdir()} - known
        # Cgroups are shared by every state directory on the host: only ids we have a trace of.
        orphans |= (self.cgroups.existing() & orphans) - known
        # A disk without even a container directory (``create`` makes that first, and
        # ``destroy`` removes it last): not one being made right now.
        disks = {p.name for p in self.storage.root.iterdir() if p.name != storage.SNAPSHOTS_DIR}
        orphan_disks = {
            cid for cid in disks - known if not self.containers_dir.joinpath(cid).exists()
        }
        for cid in sorted(orphans):
            try:
                await self._remove_oci(cid)
            except Exception:  # the rest of the sweep must still run
                log.exception("sweeping leftovers of %s: removing its OCI state failed", cid)
            shutil.rmtree(self.socket_dir(cid), ignore_errors=True)
        for cid in sorted(orphan_disks):
            await asyncio.to_thread(self.storage.remove, cid)
        return sorted(orphans | orphan_disks)

    async def memory_usage(self, container_id: str) -> int | None:
        """Bytes the container's memory cgroup is charged with (processes, page cache, tmpfs)."""
        return self.cgroups.memory_usage(container_id)

    # -- services inside ----------------------------------------------------------------

    async def connect_port(self, container_id: str, port: int) -> ByteStream:
        """A socket made in the container's network namespace (``netns_dial.py`` says how
        and why), connected to its loopback."""
        netns = await self._container_netns(container_id)
        try:
            sock = await self._dialer.connect(netns, port)
        except ConnectionRefusedError:
            msg = f"nothing listens on 127.0.0.1:{port} in container {container_id}"
            raise PortNotListening(msg, param="port") from None
        return SocketByteStream(sock)

    async def _container_netns(self, container_id: str) -> Netns:
        held = self._netns.get(container_id)
        if held is not None and held.alive():
            return held
        self._forget_netns(container_id)
        pid = await self.agent_pid(container_id)
        netns = open_netns(pid, container_id) if pid is not None else None
        if netns is None:
            msg = f"container {container_id} is not running"
            raise ContainerNotFound(msg, param="container_id")
        raced = self._netns.get(container_id)
        if raced is not None and raced.alive():  # another connection opened it meanwhile
            netns.close()
            return raced
        self._forget_netns(container_id)
        self._netns[container_id] = netns
        return netns

    def _forget_netns(self, container_id: str) -> None:
        held = self._netns.pop(container_id, None)
        if held is not None:
            held.close()

    async def responsive(self, container_id: str) -> bool:
        try:
            await agent_client.ping(self.socket_path(container_id))
        except (AgentUnavailable, OSError, ValueError):
            return False
        return True

    def describe(self) -> RuntimeInfo:
        name = self.image_rootfs.parent.name  # ``<profile>-<recipe hash>``
        return RuntimeInfo(
            image_id=name,
            image_profile=name.rpartition("-")[0],
            cgroup=self.cgroups.mode.value,
            disk_quota=self.storage.quota_mode,
        )

    async def image_file(self, path: str) -> bytes | None:
        """Read from the shared image on this host (root's, never writable by a container)."""
        target = self.image_rootfs / path.lstrip("/")
        try:
            return await asyncio.to_thread(target.read_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    # -- skills (``skill_layouts.py``) ------------------------------------------------------

    async def install_skill(self, key: str, archive: ByteSource) -> bool:
        if self.skills.has(key):  # (``has`` checks the key)
            return False
        return await anyio.to_thread.run_sync(self.skills.install, key, sync_chunks(archive))

    async def skill_keys(self) -> builtins.list[str]:
        return await asyncio.to_thread(self.skills.keys)

    async def remove_skill(self, key: str) -> None:
        check_key(key)
        await asyncio.to_thread(self.skills.remove, key)

    # -- files (``host_files.py``) ----------------------------------------------------------

    async def read_file(
        self, container_id: str, rel: str, *, follow_links: bool = False, param: str = "path"
    ) -> AsyncIterator[bytes]:
        return await self.files.read_file(container_id, rel, follow_links=follow_links, param=param)

    async def write_file(
        self,
        container_id: str,
        rel: str,
        chunks: ByteSource,
        *,
        follow_links: bool = False,
        param: str = "path",
    ) -> tuple[str, int]:
        return await self.files.write_file(
            container_id, rel, chunks, follow_links=follow_links, param=param
        )

    async def stat_file(self, container_id: str, rel: str) -> FileInfo | None:
        return await self.files.stat_file(container_id, rel)

    async def list_files(self, container_id: str) -> builtins.list[FileInfo]:
        return await self.files.list_files(container_id)

    async def remove_file(self, container_id: str, rel: str, *, param: str = "path") -> None:
        await self.files.remove_file(container_id, rel, param=param)

    async def resolve_path(self, container_id: str, rel: str, *, param: str = "path") -> str:
        return await self.files.resolve_path(container_id, rel, param=param)

    async def apply_patch(
        self, container_id: str, operations: Sequence[PatchOperation]
    ) -> PatchResult:
        return await self.files.apply_patch(container_id, operations)

    async def export_archive(
        self, container_id: str, rel_dir: str, exclude: Sequence[str], *, timeout_ms: int
    ) -> AsyncIterator[bytes]:
        return await self.files.export_archive(
            container_id, rel_dir, exclude, timeout_ms=timeout_ms
        )

    async def import_archive(
        self, container_id: str, rel_dir: str, body: ByteSource, *, timeout_ms: int
    ) -> int:
        return await self.files.import_archive(container_id, rel_dir, body, timeout_ms=timeout_ms)

    async def sweep_uploads(self, container_id: str) -> int:
        return await self.files.sweep_uploads(container_id)

    # -- exec -------------------------------------------------------------------------------

    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        sock = self.socket_path(container_id)
        if not sock.exists():
            state = await self.state(container_id)
            if state == "absent" and not (self.container_dir(container_id) / "spec.json").exists():
                msg = f"no such container: {container_id}"
                raise ContainerNotFound(msg)
        env = self.container_env(container_id)
        answered = False
        try:
            async for event in agent_client.exec_stream(sock, request, base_env=env):
                answered = True
                yield event
            return
        except AgentNotReachable:
            running = await self.state(container_id) == "running"
            if running and await self._dying(container_id):
                running = False  # start() removes what is left of it first
        except InvalidRequest:
            # What the server sends is valid, so an agent refusing it before running anything
            # may speak another protocol: one this process adopted without ``start``. Ask it.
            if answered or await self._agent_is_current(sock):
                raise
            log.warning("sandbox %s: its agent speaks another protocol; restarting", container_id)
            await self.start(container_id)
            async for event in agent_client.exec_stream(sock, request, base_env=env):
                yield event
            return
        # Nothing of this request reached the sandbox, so it can be sent again. (An agent
        # lost in the middle of a call raises instead: its commands may have partly run.)
        if not running:
            # The sandbox died under the server (its PID 1 was killed: an operator, the
            # host's OOM killer): start it again from its disk, as a server restart would.
            log.warning("sandbox %s was down; starting it again", container_id)
            await self.start(container_id)
            async for event in agent_client.exec_stream(sock, request, base_env=env):
                yield event
            return
        # The container runs but its agent does not listen: run through the OCI runtime.
        log.warning("sandbox %s: its agent does not listen; running through exec", container_id)
        for index, result in enumerate(await self._exec_fallback(container_id, request)):
            yield CommandFinished(index, result)

    async def pty(self, container_id: str, request: PtyRequest) -> PtySession:
        sock = self.socket_path(container_id)
        env = self.container_env(container_id)
        try:
            return await pty_client.open_pty(sock, request, base_env=env)
        except InvalidRequest as exc:
            # An agent another release started (adopted unasked): one of another protocol is
            # replaced, as ``exec`` replaces it; one of this protocol predating terminals says
            # it does not know the op.
            if await self._agent_is_current(sock):
                if "unknown op" not in exc.message:
                    raise
                msg = (
                    f"container {container_id} runs an agent from an earlier shellbox release, "
                    "which has no terminals; they work in containers started since"
                )
                raise Conflict(msg) from None
            log.warning("sandbox %s: its agent speaks another protocol; restarting", container_id)
            await self.start(container_id)
            return await pty_client.open_pty(sock, request, base_env=env)
        except AgentNotReachable:
            running = await self.state(container_id) == "running"
            if running and not await self._dying(container_id):
                raise
            if not running and not (self.container_dir(container_id) / "spec.json").exists():
                msg = f"no such container: {container_id}"
                raise ContainerNotFound(msg) from None
        # Down under the server (as ``exec`` says): start it again from its disk.
        log.warning("sandbox %s was down; starting it again", container_id)
        await self.start(container_id)
        return await pty_client.open_pty(sock, request, base_env=env)

    async def _dying(self, container_id: str) -> bool:
        """Whether the container's PID 1 is exiting. The OCI runtime reports a container
        "running" until its PID 1 is a zombie, which takes as long as tearing down its
        namespaces (its processes, its mounts: syncing the overlay's upper layer)."""
        pid = await self.agent_pid(container_id)
        if pid is None:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            flags = int(stat.rsplit(")", 1)[1].split()[6])  # field 9
        except (OSError, ValueError, IndexError):
            return True  # gone meanwhile
        return bool(flags & PF_EXITING)

    @staticmethod
    async def _agent_is_current(sock: Path) -> bool:
        """False only when the agent answers in another protocol version."""
        try:
            await agent_client.ping(sock)
        except AgentOutdated:
            return False
        except (AgentUnavailable, OSError, ValueError):
            pass
        return True

    def container_env(self, container_id: str) -> dict[str, str]:
        """The clean environment plus the spec's ``env`` (egress proxy variables and the like)."""
        spec_env = self._spec_env.get(container_id)
        if spec_env is None:
            try:
                spec = self.load_spec(container_id)
            except ContainerNotFound:
                spec_env = {}
            else:
                network = (
                    self.network.env(container_id)
                    if spec.network is not None and self.network is not None
                    else {}
                )
                spec_env = self._spec_env[container_id] = {**network, **spec.env}
        return {**self.base_env, **spec_env}

    async def run(self, container_id: str, request: ExecRequest) -> builtins.list[CommandResult]:
        results: builtins.list[CommandResult] = []
        async for event in self.exec(container_id, dataclasses.replace(request, stream=False)):
            if isinstance(event, CommandFinished):
                results.append(event.result)
        return results

    async def _exec_fallback(
        self, container_id: str, request: ExecRequest
    ) -> builtins.list[CommandResult]:
        """``crun exec`` per command, without streaming: for a container whose agent does not
        listen. A timeout kills what the command started, however it daemonized: the
        processes that appeared in the container's cgroup since (``_kill_new_processes``)."""
        env = self.container_env(container_id)
        env.update(request.env or {})
        results: builtins.list[CommandResult] = []
        for command in request.commands:
            sub = self.cgroups.exec_cgroup(container_id)
            args = [
                "--root",
                str(self.oci_root),
                "exec",
                *(["--cgroup", sub] if sub else []),
                "--user",
                f"{oci.SANDBOX_UID}:{oci.SANDBOX_UID}",
                "--cwd",
                request.cwd or protocol.WORKDIR,
                *(a for k, v in env.items() for a in ("--env", f"{k}={v}")),
                container_id,
                "/bin/bash",
                "-c",
                FALLBACK_SCRIPT,
            ]
            before = self.cgroups.pids(container_id)
            proc = await self._spawn(
                args,
                hostns.Namespace(hybrid=self.cgroups.mode is CgroupMode.hybrid),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            script = command.encode("utf-8", "surrogatepass")
            try:
                out, err = await asyncio.wait_for(
                    proc.communicate(script), request.timeout_ms / 1000
                )
                code = proc.returncode or 0
                outcome = Outcome("exit", 128 - code if code < 0 else code)
            except TimeoutError:
                await self._kill_new_processes(container_id, before)
                with contextlib.suppress(ProcessLookupError):  # it may have ended with them
                    proc.kill()
                out, err = await proc.communicate()
                outcome = Outcome("timeout")
            cap = request.max_output_length
            results.append(
                CommandResult(
                    protocol.truncate_text(out.decode("utf-8", "replace"), cap),
                    protocol.truncate_text(err.decode("utf-8", "replace"), cap),
                    outcome,
                )
            )
        return results

    async def _kill_new_processes(self, container_id: str, before: set[int]) -> None:
        """Kill every process of the container that is not in ``before``. The container is
        frozen meanwhile, so nothing can fork past the list; the kills land as it thaws."""
        await self.pause(container_id)
        try:
            for pid in self.cgroups.pids(container_id) - before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            await self.resume(container_id)

    # -- OCI runtime calls ------------------------------------------------------------------

    def _wrapper_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}

    async def _spawn(
        self,
        args: builtins.list[str],
        ns: hostns.Namespace,
        *,
        stdin: int = asyncio.subprocess.DEVNULL,
        stdout: int,
        stderr: int,
    ) -> asyncio.subprocess.Process:
        argv = [self.binary_path or self.binary, *args]
        env = self._wrapper_env()
        if hostns.in_private_namespace() or not ns.needed:
            return await asyncio.create_subprocess_exec(
                *argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env
            )
        return await asyncio.create_subprocess_exec(
            *argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env,
            preexec_fn=hostns.exec_in(ns, argv, env),
        )  # fmt: skip

    async def _oci(
        self,
        *args: str,
        check: bool = True,
        capture: bool = False,
        ns: hostns.Namespace | None = None,
        stdin: int = asyncio.subprocess.DEVNULL,
        stdio: int | None = None,
    ) -> str | None:
        if ns is None:
            ns = hostns.Namespace(hybrid=self.cgroups.mode is CgroupMode.hybrid)
        # A detached container must not inherit a pipe (the call would never end): crun
        # run gets the agent's log file for both streams.
        out_target = stdio if stdio is not None else asyncio.subprocess.PIPE
        proc = await self._spawn(
            ["--root", str(self.oci_root), *args], ns, stdin=stdin, stdout=out_target,
            stderr=out_target,
        )  # fmt: skip
        out, err = await proc.communicate()
        if proc.returncode != 0:
            if check:
                text = (err or b"").decode(errors="replace").strip()
                if stdio is not None:
                    os.lseek(stdio, 0, os.SEEK_SET)
                    text = os.read(stdio, 1 << 20).decode(errors="replace").strip()[-2000:]
                msg = f"{self.binary} {args[0]} failed ({proc.returncode}): {text}"
                raise SandboxError(msg)
            return None
        return out.decode() if capture and out is not None else ""


def _tail(path: Path, limit: int = 800) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _write_spec(cdir: Path, spec: ContainerSpec) -> None:
    """Replace ``spec.json``, root's only, without the network's secret values (its
    ``SandboxNetwork`` keeps them, sealed)."""
    if spec.network is not None:
        secrets = tuple(dataclasses.replace(s, value="") for s in spec.network.secrets)
        spec = dataclasses.replace(spec, network=dataclasses.replace(spec.network, secrets=secrets))
    path = cdir / "spec.json"
    tmp = cdir / ".spec.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(json.dumps(spec_to_json(spec)))
    os.replace(tmp, path)


if TYPE_CHECKING:  # mypy checks that the driver is a whole ``Runtime``

    def _is_a_runtime(rt: OciRuntime) -> Runtime:
        return rt
