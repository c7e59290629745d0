"""``ClusterRuntime``: the ``Runtime`` of an API replica, which runs no sandbox itself.

A new container goes to an available node (up and heard from within ``node_timeout_s``) with
its ``memory_limit`` free, the one with the fewest containers among them; the placement is
written to the database before the sandbox is made, so every replica routes every later call
for it to that node (a container never moves). A fork goes to the node of its snapshot.

A container whose node is lost or stopped answers ``NodeUnavailable`` (503) at once, without
trying the node: it stays listed, and works again with its files when the node is back. One
deleted meanwhile is not kept waiting for it: its placement is marked doomed and the delete
succeeds; the reaper lease holder removes it from its node once the node is back
(``destroy_doomed``). Snapshots likewise. A stored snapshot the database does not know at all
(a replica died between the node taking it and its row being written) is removed by the
reaper lease holder's sweep of each node (``remove_snapshot_leftovers``, ``leftovers.py``).
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import anyio

from shellbox.errors import (
    CapacityExceeded,
    ContainerNotFound,
    NodeUnavailable,
    ShellboxError,
    SnapshotNotFound,
)
from shellbox.sandbox.base import (
    MEMORY_LIMIT_BYTES,
    ByteSource,
    CommandResult,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    FileInfo,
    PatchResult,
    PtyRequest,
    PtySession,
    RecoveryAction,
    Runtime,
    RuntimeInfo,
    SandboxInfo,
    SandboxState,
    SnapshotTaken,
)
from shellbox.store.nodes import NodeRecord, NodeStore, PlacementKind, Refused

if TYPE_CHECKING:
    from anyio.abc import ByteStream

    from shellbox.patch import PatchOperation

log = logging.getLogger("shellbox.cluster")
# How a replica reaches a node: ``RemoteRuntime(node.url, cluster_key)`` in production.
Connect = Callable[[NodeRecord], Runtime]
INFO_TTL_S = 10.0  # how long describe() reuses what the nodes registered
SKILL_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,200}")
CHUNK = 1 << 16
NO_INFO = RuntimeInfo(image_id="unknown", image_profile="unknown")


def unavailable(item: str, node: NodeRecord) -> NodeUnavailable:
    if node.state == "stopped":
        why = "it was stopped"
    else:
        why = f"no heartbeat for {node.silent_ms // 1000} s"
    msg = (
        f"{item} is on sandbox node {node.name!r}, which is unavailable ({why}); it answers "
        "again once that node is back"
    )
    return NodeUnavailable(msg, param="container_id")


@dataclass(frozen=True)
class LeftoverSweep:
    """What one sweep of a node's stored snapshots did."""

    removed: list[str]
    # A snapshot too young to judge (being taken, perhaps) is kept: look again in this long
    # (None: nothing was kept for its age).
    recheck_in_ms: int | None


class ClusterRuntime:
    """``spool_dir``: where skills handed over (``install_skill``) wait for the node a
    container is placed on (the skills feature installs them before the container is made,
    so before its node is chosen); emptied at start."""

    def __init__(
        self, nodes: NodeStore, connect: Connect, *, node_timeout_s: float, spool_dir: Path
    ) -> None:
        self.nodes = nodes
        self.connect = connect
        self.timeout_ms = int(node_timeout_s * 1000)
        self.spool_dir = spool_dir
        shutil.rmtree(spool_dir, ignore_errors=True)
        spool_dir.mkdir(mode=0o700, parents=True)
        self._clients: dict[tuple[str, str], Runtime] = {}
        self._info = NO_INFO
        self._info_at = 0.0

    # -- where things are -------------------------------------------------------------------

    def _client(self, node: NodeRecord) -> Runtime:
        key = (node.name, node.url)  # a node back on another address gets a new client
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = self.connect(node)
        return client

    def _holder(self, item_id: str, what: str = "container") -> tuple[NodeRecord, Runtime] | None:
        """The node holding ``item_id`` and its client (None: nothing placed under it);
        ``NodeUnavailable`` when that node is lost or stopped."""
        node = self.nodes.node_of(item_id)
        if node is None:
            return None
        if not node.available(self.timeout_ms):
            item = f"{what} {item_id}"
            raise unavailable(item, node)
        return node, self._client(node)

    def _route(self, cid: str) -> Runtime:
        found = self._holder(cid)
        if found is None:
            # Not placed: never created through the cluster, or destroyed. The runtime holds
            # no such container (the container service answers 404s before it gets here).
            msg = f"No container found with id '{cid}'."
            raise ContainerNotFound(msg, param="container_id")
        return found[1]

    def _place(
        self, item_id: str, kind: PlacementKind, memory_bytes: int, on: str | None = None
    ) -> NodeRecord:
        placed = self.nodes.place(item_id, kind, memory_bytes, timeout_ms=self.timeout_ms, on=on)
        if isinstance(placed, NodeRecord):
            return placed
        raise _refusal(placed, memory_bytes, on)

    async def _undo(self, client: Runtime, item_id: str, kind: PlacementKind) -> None:
        """After a failed create or fork: remove what the node may have made, then the
        placement (best effort: the creation's own error is what the caller sees). A node
        lost meanwhile has it removed once it is back (``destroy_doomed``)."""
        try:
            await _remove_on(client, item_id, kind)
        except NodeUnavailable:
            self.nodes.doom(item_id)
            log.warning("undoing %s %s: its node is unavailable; removed once back", kind, item_id)
            return
        except (ShellboxError, OSError):
            log.exception("undoing %s %s on its node failed", kind, item_id)
        self.nodes.unplace(item_id)

    # -- lifecycle ----------------------------------------------------------------------------

    async def create(self, spec: ContainerSpec) -> None:
        node = self._place(spec.id, "container", MEMORY_LIMIT_BYTES[spec.memory_limit])
        client = self._client(node)
        try:
            await self._hand_skills(client, spec)
            await client.create(spec)
        except BaseException:
            await self._undo(client, spec.id, "container")
            raise
        log.info("container %s placed on node %s", spec.id, node.name)

    async def fork(self, spec: ContainerSpec, snapshot_id: str) -> None:
        found = self._holder(snapshot_id, "snapshot")
        if found is None:
            msg = f"No snapshot found with id '{snapshot_id}'."
            raise SnapshotNotFound(msg, param="snapshot_id")
        node = self._place(
            spec.id, "container", MEMORY_LIMIT_BYTES[spec.memory_limit], on=found[0].name
        )
        client = self._client(node)
        try:
            await self._hand_skills(client, spec)
            await client.fork(spec, snapshot_id)
        except BaseException:
            await self._undo(client, spec.id, "container")
            raise

    async def update(self, spec: ContainerSpec) -> None:
        client = self._route(spec.id)
        await self._hand_skills(client, spec)
        await client.update(spec)

    async def start(self, container_id: str) -> None:
        await self._route(container_id).start(container_id)

    async def responsive(self, container_id: str) -> bool:
        return await self._route(container_id).responsive(container_id)

    async def pause(self, container_id: str) -> None:
        await self._route(container_id).pause(container_id)

    async def resume(self, container_id: str) -> None:
        await self._route(container_id).resume(container_id)

    async def snapshot(self, container_id: str, snapshot_id: str) -> SnapshotTaken:
        found = self._holder(container_id)
        if found is None:
            return await self._route(container_id).snapshot(container_id, snapshot_id)
        node, client = found
        self._place(snapshot_id, "snapshot", 0, on=node.name)
        try:
            return await client.snapshot(container_id, snapshot_id)
        except BaseException:
            await self._undo(client, snapshot_id, "snapshot")
            raise

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._remove(snapshot_id, "snapshot")

    async def snapshot_ids(self) -> list[str]:
        nodes = self.nodes.all()
        return [sid for node in nodes for sid in self.nodes.placed(node.name, "snapshot")]

    async def stop(self, container_id: str) -> None:
        await self._route(container_id).stop(container_id)

    async def destroy(self, container_id: str) -> None:
        await self._remove(container_id, "container")

    async def _remove(self, item_id: str, kind: PlacementKind) -> None:
        """Destroy a container or delete a snapshot on its node; on an unavailable node, mark
        it doomed instead (``destroy_doomed`` removes it once the node is back): the caller
        has ended it, and its node's absence must not keep it alive for the API."""
        try:
            found = self._holder(item_id, kind)
            if found is None:
                return  # idempotent
            await _remove_on(found[1], item_id, kind)
        except NodeUnavailable as exc:  # lost before, or found lost by this very call
            self.nodes.doom(item_id)
            log.warning("%s %s is removed from its node once it is back: %s", kind, item_id, exc)
            return
        self.nodes.unplace(item_id)

    async def destroy_doomed(self) -> int:
        """Remove from every available node what was deleted while it was unavailable (the
        reaper lease holder's housekeeping); returns how many were removed. One that fails
        stays doomed for the next round."""
        removed = 0
        for node in self.nodes.all():
            if not node.available(self.timeout_ms):
                continue
            for item_id, kind in self.nodes.doomed(node.name):
                try:
                    await _remove_on(self._client(node), item_id, kind)
                except (ShellboxError, OSError) as exc:
                    log.warning("removing doomed %s %s from %s: %s", kind, item_id, node.name, exc)
                    continue
                self.nodes.unplace(item_id)
                log.info("doomed %s %s removed from node %s", kind, item_id, node.name)
                removed += 1
        return removed

    async def remove_snapshot_leftovers(
        self, node: NodeRecord, listed: Callable[[], Iterable[str]], grace_ms: int
    ) -> LeftoverSweep:
        """Delete from ``node`` the stored snapshots with no listed row (``listed``: the
        database's ids), as one server's ``SnapshotService.sweep`` does at start. Kept: a
        listed one; one doomed (``destroy_doomed``'s); one placed less than ``grace_ms``
        ago, which may be being taken right now (its row is written once the node has it).

        The node is asked first, the database after: a snapshot is placed before its node
        takes it, so any snapshot the node lists that is not placed, or placed long ago
        without a row, is provably nobody's (one deleted meanwhile is deleted again: a
        no-op)."""
        client = self._client(node)
        stored = await client.snapshot_ids()
        known = set(listed())
        placed = {p.id: p for p in self.nodes.placements(node.name)}
        removed: builtins.list[str] = []
        young: builtins.list[int] = []
        for sid in stored:
            if sid in known:
                continue
            placement = placed.get(sid)
            if placement is not None:
                if placement.kind != "snapshot":
                    continue  # doomed: removed by ``destroy_doomed``
                if placement.age_ms < grace_ms:
                    young.append(grace_ms - placement.age_ms)
                    continue
            await client.delete_snapshot(sid)
            if placement is not None:
                self.nodes.unplace(sid)
            log.info("leftover snapshot %s removed from node %s", sid, node.name)
            removed.append(sid)
        return LeftoverSweep(removed, min(young) if young else None)

    async def state(self, container_id: str) -> SandboxState:
        return await self._route(container_id).state(container_id)

    async def list(self) -> builtins.list[SandboxInfo]:
        """What the available nodes hold of what is placed on them."""
        found: builtins.list[SandboxInfo] = []
        for node in self.nodes.all():
            if not node.available(self.timeout_ms):
                continue
            placed = set(self.nodes.placed(node.name, "container"))
            found += [i for i in await self._client(node).list() if i.id in placed]
        return found

    async def recover(self) -> dict[str, RecoveryAction]:
        """Nothing to do here: each node recovers its own containers when it starts."""
        return {}

    def describe(self) -> RuntimeInfo:
        """What the nodes registered (they run one image): read at most every INFO_TTL_S."""
        now = time.monotonic()
        if now - self._info_at > INFO_TTL_S:
            for node in self.nodes.all():
                if node.available(self.timeout_ms) and node.info.get("image_id"):
                    self._info = RuntimeInfo(
                        image_id=str(node.info["image_id"]),
                        image_profile=str(node.info.get("image_profile", "unknown")),
                        cgroup=node.info.get("cgroup"),
                        disk_quota=node.info.get("disk_quota"),
                    )
                    self._info_at = now
                    break
        return self._info

    async def image_file(self, path: str) -> bytes | None:
        for node in self.nodes.all():
            if node.available(self.timeout_ms):
                return await self._client(node).image_file(path)
        msg = "no sandbox node is available to read the sandbox image from"
        raise NodeUnavailable(msg)

    # -- skills -------------------------------------------------------------------------------

    def _spooled(self, key: str) -> Path:
        if not SKILL_KEY.fullmatch(key):
            msg = f"not a valid skill key: {key!r}"
            raise ValueError(msg)
        return self.spool_dir / key

    async def install_skill(self, key: str, archive: ByteSource) -> bool:
        """Keep the archive here until a container that mounts it is placed (keys are
        content-addressed: one spooled already is kept, and ``archive`` is not read)."""
        path = self._spooled(key)
        if path.exists():
            return False
        tmp = self.spool_dir / f".{key}.{secrets.token_hex(4)}"
        try:
            if isinstance(archive, AsyncIterable):
                async with await anyio.open_file(tmp, "wb") as out:
                    async for chunk in archive:
                        await out.write(chunk)
            else:
                await anyio.to_thread.run_sync(_write_all, tmp, archive)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return True

    async def _hand_skills(self, client: Runtime, spec: ContainerSpec) -> None:
        """Give the container's node the skills it mounts (a node that holds one already
        reads nothing of it)."""
        for mount in spec.skills:
            path = self._spooled(mount.key)
            if path.exists():
                await client.install_skill(mount.key, _read_all(path))

    async def skill_keys(self) -> builtins.list[str]:
        keys = {p.name for p in self.spool_dir.iterdir() if not p.name.startswith(".")}
        for node in self.nodes.all():
            if node.available(self.timeout_ms):
                keys.update(await self._client(node).skill_keys())
        return sorted(keys)

    async def remove_skill(self, key: str) -> None:
        """From here and from every available node (a lost one keeps it: harmless, the
        skills feature removes it again from the keys it lists once the node is back)."""
        self._spooled(key).unlink(missing_ok=True)
        for node in self.nodes.all():
            if node.available(self.timeout_ms):
                await self._client(node).remove_skill(key)

    async def memory_usage(self, container_id: str) -> int | None:
        """None too for a container whose node is unavailable: the figure is for display (the
        console lists many containers), and one lost node must not fail the whole list."""
        try:
            found = self._holder(container_id)
        except NodeUnavailable:
            return None
        if found is None:
            return None
        try:
            return await found[1].memory_usage(container_id)
        except NodeUnavailable:
            return None

    # -- services inside ----------------------------------------------------------------------

    async def connect_port(self, container_id: str, port: int) -> ByteStream:
        return await self._route(container_id).connect_port(container_id, port)

    # -- commands -----------------------------------------------------------------------------

    async def pty(self, container_id: str, request: PtyRequest) -> PtySession:
        return await self._route(container_id).pty(container_id, request)

    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        client = self._route(container_id)
        # Closed with this one (a caller that stops reading: its client left), so the node
        # kills the command now, not whenever the garbage collector finalises the stream.
        stream = cast(AsyncGenerator[ExecEvent, None], client.exec(container_id, request))
        async with aclosing(stream) as events:
            async for event in events:
                yield event

    async def run(self, container_id: str, request: ExecRequest) -> builtins.list[CommandResult]:
        return await self._route(container_id).run(container_id, request)

    # -- files --------------------------------------------------------------------------------

    async def read_file(
        self, container_id: str, rel: str, *, follow_links: bool = False, param: str = "path"
    ) -> AsyncIterator[bytes]:
        return await self._route(container_id).read_file(
            container_id, rel, follow_links=follow_links, param=param
        )

    async def write_file(
        self,
        container_id: str,
        rel: str,
        chunks: ByteSource,
        *,
        follow_links: bool = False,
        param: str = "path",
    ) -> tuple[str, int]:
        return await self._route(container_id).write_file(
            container_id, rel, chunks, follow_links=follow_links, param=param
        )

    async def stat_file(self, container_id: str, rel: str) -> FileInfo | None:
        return await self._route(container_id).stat_file(container_id, rel)

    async def list_files(self, container_id: str) -> builtins.list[FileInfo]:
        return await self._route(container_id).list_files(container_id)

    async def remove_file(self, container_id: str, rel: str, *, param: str = "path") -> None:
        await self._route(container_id).remove_file(container_id, rel, param=param)

    async def resolve_path(self, container_id: str, rel: str, *, param: str = "path") -> str:
        return await self._route(container_id).resolve_path(container_id, rel, param=param)

    async def apply_patch(
        self, container_id: str, operations: Sequence[PatchOperation]
    ) -> PatchResult:
        return await self._route(container_id).apply_patch(container_id, operations)

    async def export_archive(
        self, container_id: str, rel_dir: str, exclude: Sequence[str], *, timeout_ms: int
    ) -> AsyncIterator[bytes]:
        return await self._route(container_id).export_archive(
            container_id, rel_dir, exclude, timeout_ms=timeout_ms
        )

    async def import_archive(
        self, container_id: str, rel_dir: str, body: ByteSource, *, timeout_ms: int
    ) -> int:
        return await self._route(container_id).import_archive(
            container_id, rel_dir, body, timeout_ms=timeout_ms
        )

    async def sweep_uploads(self, container_id: str) -> int:
        return await self._route(container_id).sweep_uploads(container_id)


async def _remove_on(client: Runtime, item_id: str, kind: PlacementKind) -> None:
    if kind == "container":
        await client.destroy(item_id)
    else:
        await client.delete_snapshot(item_id)


def _write_all(path: Path, chunks: Iterable[bytes]) -> None:
    with open(path, "wb") as out:
        for chunk in chunks:
            out.write(chunk)


def _read_all(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            yield data


def _refusal(refused: Refused, memory_bytes: int, on: str | None) -> ShellboxError:
    where = f"sandbox node {on!r}" if on else "sandbox node"
    if not refused.loads:
        msg = (
            f"no {where} is available to hold a new container (none has sent a heartbeat "
            "lately); retry once a node is back"
        )
        return NodeUnavailable(msg)
    most = max(refused.loads, key=lambda load: load.free_memory_bytes)
    msg = (
        f"no {where} has {memory_bytes >> 30} GiB of memory free for a new container (the "
        f"most is {max(0, most.free_memory_bytes) >> 30} GiB on {most.node.name!r}); delete "
        "containers, ask for a smaller memory_limit, or add a node"
    )
    return CapacityExceeded(msg)
