"""``OciRuntime``: sandbox containers with crun (default) or runc, on this host.

Disk layout under the state directory, per container ``<state>/containers/<id>/``:

    spec.json   the ContainerSpec, to recreate the bundle after a restart
    config.json the OCI bundle config (rewritten at every start)
    upper/ work/  the overlay's private layer (the shared image is the lower layer)
    rootfs/     the overlay mount point (mounted only inside the container's namespace)
    data/       bind-mounted at /mnt/data; the host reads and writes container files here
    agent.log   the agent's stdout/stderr

Volatile pieces live in ``/run/shellbox/<hash of state dir>/`` (short paths: a Unix socket
path must fit in 108 bytes): the OCI runtime's own state and each container's socket
directory, mode 0700 and owned by the container's root, so uid 1000 inside cannot reach the
agent.

The overlay is mounted in a private mount namespace made just for the ``crun run`` call, so
the mount exists only inside the container and disappears with it: a crash of the server
can never leave a mount behind on the host. On hybrid cgroup hosts the same namespace
unmounts ``/sys/fs/cgroup/unified``, without which crun 1.8 refuses to start anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from shellbox.agent import client as agent_client
from shellbox.agent import protocol
from shellbox.errors import AgentUnavailable, ContainerNotFound, SandboxError
from shellbox.sandbox import oci
from shellbox.sandbox.base import (
    CommandFinished,
    CommandResult,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    Mount,
    Outcome,
    SandboxInfo,
    SandboxState,
)
from shellbox.sandbox.cgroups import CgroupMode, HostCgroups, detect_mode

AGENT_SOURCE = Path(__file__).resolve().parent.parent / "agent"
AGENT_FILES = ("server.py", "protocol.py")
RUN_BASE = Path("/run/shellbox")
# A private mount namespace for one OCI runtime call: drop the v2 mount of a hybrid host, and
# mount the overlay root when starting. "$@" is the runtime's command line.
WRAPPER = """set -e
if [ -n "$SHELLBOX_HYBRID" ]; then umount -l /sys/fs/cgroup/unified 2>/dev/null || true; fi
if [ -n "$SHELLBOX_OVERLAY" ]; then mount -t overlay overlay -o "$SHELLBOX_OVERLAY" "$SHELLBOX_ROOTFS"; fi
exec "$@"
"""


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
    ) -> None:
        self.state_dir = state_dir.resolve()
        self.image_rootfs = image_rootfs
        self.binary = binary
        self.binary_path = shutil.which(binary)
        if self.binary_path is None:
            msg = f"{binary} is not installed; run ./scripts/setup.sh"
            raise SandboxError(msg)
        self.cgroups = HostCgroups(detect_mode())
        self.seccomp = oci.load_seccomp() if seccomp else None
        key = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        self.run_base = RUN_BASE / key
        self.oci_root = self.run_base / binary
        self.containers_dir = self.state_dir / "containers"
        self.containers_dir.mkdir(parents=True, exist_ok=True)
        self.oci_root.mkdir(parents=True, exist_ok=True)
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

    # -- paths ------------------------------------------------------------------------------

    def container_dir(self, container_id: str) -> Path:
        if not container_id or "/" in container_id or container_id.startswith("."):
            raise ContainerNotFound(f"no such container: {container_id!r}")
        return self.containers_dir / container_id

    def data_dir(self, container_id: str) -> Path:
        return self.container_dir(container_id) / "data"

    def socket_dir(self, container_id: str) -> Path:
        return self.run_base / "sock" / container_id

    def socket_path(self, container_id: str) -> Path:
        return self.socket_dir(container_id) / protocol.SOCKET_NAME

    def _lock(self, container_id: str) -> asyncio.Lock:
        return self._locks.setdefault(container_id, asyncio.Lock())

    def _install_agent(self) -> Path:
        """Copy the agent's two files where the container's root can read them."""
        blob = b"".join((AGENT_SOURCE / f).read_bytes() for f in AGENT_FILES)
        target = self.state_dir / "agent" / hashlib.sha256(blob).hexdigest()[:12]
        if not (target / "complete").exists():
            target.mkdir(parents=True, exist_ok=True)
            for f in AGENT_FILES:
                shutil.copyfile(AGENT_SOURCE / f, target / f)
                os.chmod(target / f, 0o644)
            (target / "complete").touch()
            os.chmod(target, 0o755)
            os.chmod(target.parent, 0o755)
        return target

    # -- lifecycle --------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> None:
        cdir = self.container_dir(spec.id)
        for sub in ("upper", "work", "rootfs", "data"):
            (cdir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(cdir, 0o711)  # the container root must traverse it to its rootfs
        root_uid = oci.host_uid(0)
        os.chown(cdir / "upper", root_uid, root_uid)
        os.chmod(cdir / "upper", 0o755)
        sandbox_uid = oci.host_uid(oci.SANDBOX_UID)
        os.chown(cdir / "data", sandbox_uid, sandbox_uid)
        os.chmod(cdir / "data", 0o755)
        (cdir / "spec.json").write_text(json.dumps(_spec_to_json(spec)))

    def load_spec(self, container_id: str) -> ContainerSpec:
        path = self.container_dir(container_id) / "spec.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ContainerNotFound(f"no such container: {container_id}") from None
        return _spec_from_json(raw)

    async def update_spec(self, spec: ContainerSpec) -> None:
        """Replace the stored spec (used on the next start)."""
        (self.container_dir(spec.id) / "spec.json").write_text(json.dumps(_spec_to_json(spec)))

    async def start(self, container_id: str) -> None:
        async with self._lock(container_id):
            state = await self.state(container_id)
            if state == "running":
                try:
                    await agent_client.ping(self.socket_path(container_id))
                    return
                except AgentUnavailable:
                    pass
            if state != "absent":
                await self._remove_oci(container_id)
            await self._start(container_id)

    async def _start(self, container_id: str) -> None:
        spec = self.load_spec(container_id)
        cdir = self.container_dir(container_id)
        sock_dir = self.socket_dir(container_id)
        sock_dir.mkdir(parents=True, exist_ok=True)
        root_uid = oci.host_uid(0)
        os.chown(sock_dir, root_uid, root_uid)
        os.chmod(sock_dir, 0o700)
        (sock_dir / protocol.SOCKET_NAME).unlink(missing_ok=True)
        self.cgroups.prepare(container_id, root_uid)
        config = oci.build_config(
            spec,
            rootfs=cdir / "rootfs",
            data_dir=cdir / "data",
            run_dir=sock_dir,
            agent_dir=self.agent_dir,
            cgroups_path=self.cgroups.cgroups_path(container_id),
            seccomp=self.seccomp,
        )
        (cdir / "config.json").write_text(json.dumps(config))
        overlay = (
            f"lowerdir={self.image_rootfs},upperdir={cdir / 'upper'},workdir={cdir / 'work'}"
        )
        log = open(cdir / "agent.log", "wb+")  # noqa: SIM115 - handed to the container
        try:
            await self._oci(
                "run", "--detach", "--bundle", str(cdir), container_id,
                overlay=overlay, rootfs=cdir / "rootfs", stdio=log.fileno(),
            )
        finally:
            log.close()
        await agent_client.wait_ready(self.socket_path(container_id))

    async def pause(self, container_id: str) -> None:
        await self._oci("pause", container_id)

    async def resume(self, container_id: str) -> None:
        await self._oci("resume", container_id)

    async def stop(self, container_id: str) -> None:
        async with self._lock(container_id):
            await self._remove_oci(container_id)

    async def destroy(self, container_id: str) -> None:
        async with self._lock(container_id):
            await self._remove_oci(container_id)
            cdir = self.container_dir(container_id)
            if cdir.exists():
                await asyncio.to_thread(shutil.rmtree, cdir, True)
            shutil.rmtree(self.socket_dir(container_id), ignore_errors=True)
        self._locks.pop(container_id, None)

    async def _remove_oci(self, container_id: str) -> None:
        """Kill every process and remove the OCI container and its cgroups; keep the disk."""
        if await self.state(container_id) != "absent":
            if self.binary == "runc":  # runc's delete -f is slow; kill + delete is not
                await self._oci("kill", container_id, "KILL", check=False)
            await self._oci("delete", "--force", container_id, check=False)
        await asyncio.to_thread(self.cgroups.remove, container_id)
        self.socket_path(container_id).unlink(missing_ok=True)

    async def state(self, container_id: str) -> SandboxState:
        out = await self._oci("state", container_id, check=False, capture=True)
        if out is None:
            return "absent"
        try:
            status = json.loads(out).get("status")
        except json.JSONDecodeError:
            return "absent"
        if status == "running":
            return "running"
        if status == "paused":
            return "paused"
        return "stopped"

    async def list(self) -> list[SandboxInfo]:
        out = []
        for entry in sorted(self.containers_dir.iterdir()):
            if (entry / "spec.json").exists():
                out.append(SandboxInfo(entry.name, await self.state(entry.name)))
        return out

    # -- exec -------------------------------------------------------------------------------

    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        sock = self.socket_path(container_id)
        if not sock.exists():
            state = await self.state(container_id)
            if state == "absent" and not (self.container_dir(container_id) / "spec.json").exists():
                raise ContainerNotFound(f"no such container: {container_id}")
        try:
            async for event in agent_client.exec_stream(sock, request, base_env=self.base_env):
                yield event
        except AgentUnavailable:
            if await self.state(container_id) != "running":
                raise
            # The agent is gone but the container lives: run through the OCI runtime instead.
            for index, result in enumerate(await self._exec_fallback(container_id, request)):
                yield CommandFinished(index, result)

    async def run(self, container_id: str, request: ExecRequest) -> list[CommandResult]:
        results: list[CommandResult] = []
        async for event in self.exec(container_id, dataclasses.replace(request, stream=False)):
            if isinstance(event, CommandFinished):
                results.append(event.result)
        return results

    async def _exec_fallback(self, container_id: str, request: ExecRequest) -> list[CommandResult]:
        env = dict(self.base_env)
        env.update(request.env or {})
        results = []
        for command in request.commands:
            args = [
                self.binary_path or self.binary, "--root", str(self.oci_root), "exec",
                "--user", f"{oci.SANDBOX_UID}:{oci.SANDBOX_UID}",
                "--cwd", request.cwd or protocol.WORKDIR,
                *(a for k, v in env.items() for a in ("--env", f"{k}={v}")),
                container_id, "/bin/bash", "-c", command,
            ]
            proc = await asyncio.create_subprocess_exec(
                *self._wrap(args), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=self._wrapper_env(), start_new_session=True,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), request.timeout_ms / 1000)
                outcome = Outcome("exit", proc.returncode)
            except TimeoutError:
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

    # -- OCI runtime calls ------------------------------------------------------------------

    def _wrap(self, args: list[str]) -> list[str]:
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", WRAPPER,
                "shellbox-oci", *args]

    def _wrapper_env(self, overlay: str = "", rootfs: Path | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
        if self.cgroups.mode is CgroupMode.hybrid:
            env["SHELLBOX_HYBRID"] = "1"
        if overlay:
            env["SHELLBOX_OVERLAY"] = overlay
            env["SHELLBOX_ROOTFS"] = str(rootfs)
        return env

    async def _oci(
        self,
        *args: str,
        check: bool = True,
        capture: bool = False,
        overlay: str = "",
        rootfs: Path | None = None,
        stdio: int | None = None,
    ) -> str | None:
        argv = [self.binary_path or self.binary, "--root", str(self.oci_root), *args]
        if not overlay and self.cgroups.mode is not CgroupMode.hybrid:
            cmd = argv
        else:
            cmd = self._wrap(argv)
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.DEVNULL,
            # A detached container must not inherit a pipe (the call would never end): crun
            # run gets the agent's log file for both streams.
            stdout=stdio if stdio is not None else asyncio.subprocess.PIPE,
            stderr=stdio if stdio is not None else asyncio.subprocess.PIPE,
            env=self._wrapper_env(overlay, rootfs),
        )
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


def _spec_to_json(spec: ContainerSpec) -> dict[str, Any]:
    raw = dataclasses.asdict(spec)
    raw["mounts"] = [
        {"source": str(m.source), "destination": m.destination, "read_only": m.read_only}
        for m in spec.mounts
    ]
    raw["env"] = dict(spec.env)
    raw["hosts"] = dict(spec.hosts)
    return raw


def _spec_from_json(raw: dict[str, Any]) -> ContainerSpec:
    mounts = tuple(
        Mount(Path(m["source"]), m["destination"], m.get("read_only", True))
        for m in raw.pop("mounts", [])
    )
    return ContainerSpec(**raw, mounts=mounts)
