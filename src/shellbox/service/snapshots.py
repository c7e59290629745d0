"""Snapshots: a container's writable state saved (``/mnt/data``, ``/home/user`` and the rest
of its rootfs layer; ``/tmp`` is a tmpfs and is not), to start forks from.

A snapshot is a project's resource: it outlives its container, counts against
``limits.max_snapshots_per_project``, and is deleted with its storage. Forks are made by
``ContainerService.create`` with ``snapshot_id``; deleting a snapshot leaves its forks whole
(the storage frees a block when nothing refers to it any more).
"""

from __future__ import annotations

import logging
import time

from shellbox.errors import QuotaExceeded, SnapshotNotFound
from shellbox.ids import new_id
from shellbox.service.containers import ContainerService
from shellbox.service.models import Principal
from shellbox.store import SnapshotRecord, SnapshotStore
from shellbox.store.db import Order

log = logging.getLogger("shellbox.snapshots")
READY = "ready"


class SnapshotService:
    def __init__(self, store: SnapshotStore, containers: ContainerService) -> None:
        self.store = store
        self.containers = containers
        self.runtime = containers.runtime
        self.max_per_project = containers.settings.limits.max_snapshots_per_project

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
        now = int(time.time())
        record = SnapshotRecord(
            id=sid,
            project=principal.project,
            container_id=cid,
            name=name,
            status=READY,
            bytes=taken.bytes,
            created_at=now,
            last_used_at=now,
        )
        refused = self.store.insert_within(record, self.max_per_project)
        if refused is not None:  # another request took the last place meanwhile
            await self.runtime.delete_snapshot(sid)
            raise self._full(principal, refused)
        return record

    def _check_room(self, principal: Principal) -> None:
        if (
            self.max_per_project == 0
            or self.store.page(  # has_more: at least max already
                principal.project, after=None, limit=self.max_per_project - 1, order="asc"
            )[1]
        ):
            raise self._full(principal, self.max_per_project)

    def _full(self, principal: Principal, count: int) -> QuotaExceeded:
        msg = (
            f"project {principal.project!r} has {count} snapshots, the most it may keep "
            "(limits.max_snapshots_per_project); delete some"
        )
        return QuotaExceeded(msg)

    async def delete(self, principal: Principal, snapshot_id: str) -> None:
        record = self.get(principal, snapshot_id)
        await self.runtime.delete_snapshot(record.id)
        self.store.remove(record.id)

    async def sweep(self) -> None:
        """Remove stored snapshots that have no row (a create or delete cut off by a crash)."""
        known = set(self.store.ids())
        for sid in await self.runtime.snapshot_ids():
            if sid not in known:
                log.info("removing leftover snapshot %s", sid)
                await self.runtime.delete_snapshot(sid)
