"""Snapshots: a container's writable state saved (``/mnt/data``, ``/home/user`` and the rest
of its rootfs layer; ``/tmp`` is a tmpfs and is not), to start forks from.

A snapshot is a project's resource: it outlives its container, counts against
``limits.max_snapshots_per_project`` and ``limits.max_snapshot_gb_per_project``, and expires
``lifecycle.snapshot_expires_after_days`` after it was last used (taken or forked).

Deleting one (or its expiry) removes its storage at once: a fork is a btrfs snapshot of the
snapshot, so it refers to the same extents itself, and btrfs frees an extent only when the
last subvolume referring to it is gone. What the snapshot shared with live forks therefore
stays on disk as long as they do, and so its bytes keep counting against the project's quota
until the last of them ends (``SnapshotStore.hide``); only the row remains meanwhile.
"""

from __future__ import annotations

import builtins
import logging
import time

from shellbox.errors import QuotaExceeded, SnapshotNotFound
from shellbox.features import ContainerFeature
from shellbox.ids import new_id
from shellbox.service.containers import ContainerService
from shellbox.service.models import Principal
from shellbox.store import SnapshotQuota, SnapshotRecord, SnapshotStore, SnapshotUsage
from shellbox.store.db import Order

log = logging.getLogger("shellbox.snapshots")
READY = "ready"
DAY_S = 86_400


class SnapshotService(ContainerFeature):
    """Also a container feature, for its ``housekeep``: each reaper round, snapshots unused
    too long expire, and the rows of deleted ones that no live fork holds any more go."""

    def __init__(self, store: SnapshotStore, containers: ContainerService) -> None:
        self.store = store
        self.containers = containers
        self.runtime = containers.runtime
        limits = containers.settings.limits
        self.quota = SnapshotQuota(
            max_count=limits.max_snapshots_per_project,
            max_bytes=int(limits.max_snapshot_gb_per_project * (1 << 30)),
        )
        self.expires_after_s = round(
            containers.settings.lifecycle.snapshot_expires_after_days * DAY_S
        )

    def expires_at(self, record: SnapshotRecord) -> int:
        return record.last_used_at + self.expires_after_s

    def get(self, principal: Principal, snapshot_id: str) -> SnapshotRecord:
        found = self.store.get(principal.project, snapshot_id)
        if found is None:
            msg = f"No snapshot found with id '{snapshot_id}'."
            raise SnapshotNotFound(msg, param="snapshot_id")
        return found

    def list(
        self, principal: Principal, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[SnapshotRecord], bool]:
        return self.store.page(principal.project, after=after, limit=limit, order=order)

    async def create(self, principal: Principal, cid: str, name: str | None) -> SnapshotRecord:
        """Snapshot a live container (running, sleeping or paused: a sleeping or paused one is
        taken as it is, without waking it)."""
        self._check_room(principal)
        sid = new_id("snap_")
        async with self.containers.activity(principal, cid, wake=False) as container:
            taken = await self.runtime.snapshot(container.id, sid)
        log.info("snapshot %s of %s: processes frozen %.1f ms", sid, cid, taken.frozen_s * 1e3)
        held = taken.bytes
        if taken.own_writes_only and container.snapshot_id is not None:
            # A fork's disk counts only its own writes: add what it started with, so that
            # this snapshot counts all it holds (an upper bound: shared data the fork
            # overwrote counts twice) even once the snapshot it came from is gone.
            held += self.store.bytes_of(container.snapshot_id) or 0
        now = int(time.time())
        record = SnapshotRecord(
            id=sid,
            project=principal.project,
            container_id=cid,
            name=name,
            status=READY,
            bytes=held,
            created_at=now,
            last_used_at=now,
        )
        refused = self.store.insert_within(record, self.quota)
        if refused is not None:  # past a quota with it, or another request took the room
            await self.runtime.delete_snapshot(sid)
            raise self._full(principal, refused, record.bytes)
        return record

    def _check_room(self, principal: Principal) -> None:
        """Refuse before taking anything when the project is at a quota already (the insert
        checks again with the snapshot's own bytes, atomically)."""
        usage = self.store.usage(principal.project)
        if usage.count >= self.quota.max_count or usage.bytes >= self.quota.max_bytes:
            raise self._full(principal, usage, None)

    def _full(self, principal: Principal, usage: SnapshotUsage, want: int | None) -> QuotaExceeded:
        project = principal.project
        if usage.count >= self.quota.max_count:
            msg = (
                f"project {project!r} has {usage.count} snapshots, the most it may keep "
                "(limits.max_snapshots_per_project); delete some"
            )
            return QuotaExceeded(msg)
        held = (
            f", {_size(usage.held_bytes)} of it deleted snapshots that live forks still use"
            if usage.held_bytes
            else ""
        )
        this = f"; this snapshot holds {_size(want)}" if want is not None else ""
        msg = (
            f"project {project!r} holds {_size(usage.bytes)} of snapshots{held}{this}; its "
            f"quota is {_size(self.quota.max_bytes)} (limits.max_snapshot_gb_per_project): "
            "delete snapshots, or the containers forked from deleted ones"
        )
        return QuotaExceeded(msg)

    async def delete(self, principal: Principal, snapshot_id: str) -> None:
        await self._remove(self.get(principal, snapshot_id), int(time.time()))

    async def _remove(self, record: SnapshotRecord, at: int) -> None:
        # Hidden first: a crash after it leaves storage with no listed row, which ``sweep``
        # removes at the next start (never a listed snapshot without its storage).
        self.store.hide(record.id, at)
        await self.runtime.delete_snapshot(record.id)
        self._drop_released()

    def _drop_released(self) -> None:
        for sid in self.store.released():
            self.store.remove(sid)

    async def expire(self, now: float) -> builtins.list[str]:
        """Delete the snapshots last used more than ``snapshot_expires_after_days`` before
        ``now``; returns their ids."""
        cutoff = int(now) - self.expires_after_s
        expired = self.store.unused_since(cutoff + 1)
        for record in expired:
            log.info("snapshot %s expired (last used at %d)", record.id, record.last_used_at)
            await self._remove(record, int(now))
        return [r.id for r in expired]

    # -- as a container feature --------------------------------------------------------------

    async def housekeep(self) -> None:
        await self.expire(time.time())
        self._drop_released()

    async def sweep(self) -> None:
        """Remove stored snapshots that have no listed row (a create or delete cut off by a
        crash)."""
        known = set(self.store.ids())
        for sid in await self.runtime.snapshot_ids():
            if sid not in known:
                log.info("removing leftover snapshot %s", sid)
                await self.runtime.delete_snapshot(sid)


def _size(n: int) -> str:
    """Bytes for a person, with the exact count (``1.5 GiB (1610612736 bytes)``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit} ({n} bytes)"
    return f"{n} bytes"
