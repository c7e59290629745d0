"""Container lifecycle: create, wake, sleep, expire, delete, and recovery after a restart.

Statuses: ``running`` (processes up), ``sleeping`` (idle past ``idle_sleep_s``: processes
stopped, disk kept; the next call wakes it), ``expired`` (``expires_after`` minutes after
``last_active_at``: processes and files gone), ``deleted`` (hidden from the API).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select, update

from shellbox.errors import (
    ContainerNotFound,
    ContainerNotRunning,
    InvalidRequest,
    QuotaExceeded,
)
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, Mount, OciRuntime
from shellbox.sandbox.base import MEMORY_LIMIT_BYTES
from shellbox.service.models import ContainerRecord, Principal
from shellbox.settings import Settings
from shellbox.store import Database
from shellbox.store.db import Page
from shellbox.store.tables import containers

log = logging.getLogger("shellbox.containers")
LIVE = ("running", "sleeping")


@dataclass
class CreateContainer:
    name: str
    memory_limit: str = "1g"
    expires_after_minutes: int | None = None
    file_ids: list[str] = field(default_factory=list)
    network_policy: dict[str, Any] = field(default_factory=lambda: {"type": "disabled"})
    skills: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Provisioned:
    """What the egress and skills features add to a container's spec."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    netns_path: str | None = None
    hosts: dict[str, str] = field(default_factory=dict)
    network_policy: dict[str, Any] = field(default_factory=lambda: {"type": "disabled"})
    secrets: list[dict[str, str]] = field(default_factory=list)
    skills: list[dict[str, Any]] = field(default_factory=list)


# Hooks the optional features register: each gets (principal, request, container id,
# provisioned-so-far) and fills in its part, or raises InvalidRequest. ``release`` hooks undo
# per-container resources when a container ends.
ProvisionHook = Callable[[Principal, CreateContainer, str, Provisioned], Coroutine[Any, Any, None]]
ReleaseHook = Callable[[ContainerRecord], Coroutine[Any, Any, None]]
StartHook = Callable[[ContainerRecord], Coroutine[Any, Any, None]]


class ContainerService:
    def __init__(self, settings: Settings, db: Database, runtime: OciRuntime) -> None:
        self.settings = settings
        self.db = db
        self.runtime = runtime
        self.provision_hooks: list[ProvisionHook] = []
        self.release_hooks: list[ReleaseHook] = []
        self.before_start_hooks: list[StartHook] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._busy: dict[str, int] = {}
        self._reaper: asyncio.Task[None] | None = None
        # Set by the file service so file_ids are copied in at creation.
        self.copy_files: Callable[[Principal, str, list[str]], Coroutine[Any, Any, None]] | None
        self.copy_files = None

    def _lock(self, cid: str) -> asyncio.Lock:
        return self._locks.setdefault(cid, asyncio.Lock())

    # -- queries ----------------------------------------------------------------------------

    def get(self, principal: Principal, cid: str) -> ContainerRecord:
        with self.db.connect() as conn:
            row = conn.execute(
                select(containers).where(
                    containers.c.id == cid,
                    containers.c.project == principal.project,
                    containers.c.deleted.is_(False),
                )
            ).first()
        if row is None:
            msg = f"No container found with id '{cid}'."
            raise ContainerNotFound(msg, param="container_id")
        return ContainerRecord.from_row(row._mapping)

    def list(
        self,
        principal: Principal,
        *,
        after: str | None,
        limit: int,
        order: str,
        name: str | None = None,
    ) -> tuple[list[ContainerRecord], bool]:
        where = [containers.c.project == principal.project, containers.c.deleted.is_(False)]
        if name is not None:
            where.append(containers.c.name == name)
        page: Page = self.db.page(
            containers, where, after=after, limit=limit, order="asc" if order == "asc" else "desc"
        )
        return [ContainerRecord.from_row(r) for r in page.rows], page.has_more

    # -- create / delete --------------------------------------------------------------------

    async def create(self, principal: Principal, req: CreateContainer) -> ContainerRecord:
        if req.memory_limit not in MEMORY_LIMIT_BYTES:
            msg = f"memory_limit must be one of {', '.join(MEMORY_LIMIT_BYTES)}"
            raise InvalidRequest(msg, param="memory_limit")
        self._check_quota(principal, req.memory_limit)
        policy_type = (req.network_policy or {}).get("type", "disabled")
        if policy_type not in ("disabled", "allowlist"):
            msg = "network_policy.type must be 'disabled' or 'allowlist'"
            raise InvalidRequest(msg, param="network_policy.type")
        cid = new_id("cntr_")
        prov = Provisioned()
        try:
            for hook in self.provision_hooks:
                await hook(principal, req, cid, prov)
            if policy_type == "allowlist" and prov.network_policy.get("type") != "allowlist":
                msg = (
                    "network_policy 'allowlist' is not available on this server (egress is not "
                    "enabled); use {'type': 'disabled'}"
                )
                raise InvalidRequest(msg, param="network_policy")
            if req.skills and not prov.skills:
                msg = "skills are not available on this server"
                raise InvalidRequest(msg, param="skills")
            now = int(time.time())
            minutes = req.expires_after_minutes or self.settings.lifecycle.default_expiry_minutes
            record = ContainerRecord(
                id=cid,
                project=principal.project,
                name=req.name,
                status="running",
                created_at=now,
                last_active_at=now,
                expires_after_minutes=minutes,
                memory_limit=req.memory_limit,
                network_policy=prov.network_policy,
                secrets=prov.secrets,
                skills=prov.skills,
            )
            rs = self.settings.runtime
            spec = ContainerSpec(
                id=cid,
                memory_limit=req.memory_limit,  # type: ignore[arg-type]
                pids_limit=rs.pids_limit,
                cpus=rs.cpus,
                tmp_size_mb=rs.tmp_size_mb,
                env=prov.env,
                mounts=tuple(prov.mounts),
                netns_path=prov.netns_path,
                hosts=prov.hosts,
            )
            await self.runtime.create(spec)
            with self.db.begin() as conn:
                conn.execute(
                    insert(containers).values(
                        id=cid,
                        project=record.project,
                        name=record.name,
                        status="running",
                        created_at=now,
                        last_active_at=now,
                        expires_after_minutes=minutes,
                        memory_limit=record.memory_limit,
                        network_policy=record.network_policy,
                        secrets=record.secrets or None,
                        skills=record.skills or None,
                        deleted=False,
                    )
                )
            if req.file_ids and self.copy_files is not None:
                await self.copy_files(principal, cid, req.file_ids)
            for start_hook in self.before_start_hooks:
                await start_hook(record)
            await self.runtime.start(cid)
        except BaseException:
            await self._discard(cid, prov)
            raise
        return record

    async def _discard(self, cid: str, prov: Provisioned) -> None:
        """Undo a creation that failed half-way."""
        record = ContainerRecord(
            id=cid,
            project="",
            name="",
            status="deleted",
            created_at=0,
            last_active_at=0,
            expires_after_minutes=0,
            memory_limit="1g",
            network_policy=prov.network_policy,
            skills=prov.skills,
        )
        with contextlib.suppress(Exception):
            await self.runtime.destroy(cid)
        for hook in self.release_hooks:
            with contextlib.suppress(Exception):
                await hook(record)
        with self.db.begin() as conn:
            conn.execute(containers.delete().where(containers.c.id == cid))

    def _check_quota(self, principal: Principal, memory_limit: str) -> None:
        limits = self.settings.limits
        with self.db.connect() as conn:
            rows = conn.execute(
                select(containers.c.memory_limit, func.count())
                .where(
                    containers.c.project == principal.project,
                    containers.c.status.in_(LIVE),
                    containers.c.deleted.is_(False),
                )
                .group_by(containers.c.memory_limit)
            ).all()
        count = sum(n for _, n in rows)
        if count >= limits.max_containers_per_project:
            msg = (
                f"project {principal.project!r} already has {count} live containers, the most "
                "it may have; delete some or wait for them to expire"
            )
            raise QuotaExceeded(msg)
        used = sum(MEMORY_LIMIT_BYTES[m] * n for m, n in rows) // (1 << 30)
        want = MEMORY_LIMIT_BYTES[memory_limit] // (1 << 30)
        if used + want > limits.max_memory_gb_per_project:
            msg = (
                f"project {principal.project!r} uses {used} GiB of container memory; another "
                f"{memory_limit} would pass its cap of {limits.max_memory_gb_per_project} GiB"
            )
            raise QuotaExceeded(msg)

    async def delete(self, principal: Principal, cid: str) -> None:
        record = self.get(principal, cid)
        async with self._lock(cid):
            await self._end(record, "deleted")

    async def _end(self, record: ContainerRecord, status: str) -> None:
        """Destroy processes and files; mark ``expired`` or ``deleted``."""
        if record.status in LIVE:
            await self.runtime.destroy(record.id)
            for hook in self.release_hooks:
                try:
                    await hook(record)
                except Exception:
                    log.exception("releasing container %s failed", record.id)
        values: dict[str, Any] = {"status": status if status == "expired" else record.status}
        if status == "deleted":
            values = {
                "deleted": True,
                "status": "deleted" if record.status in LIVE else record.status,
            }
        with self.db.begin() as conn:
            conn.execute(update(containers).where(containers.c.id == record.id).values(**values))
        record.status = values["status"]

    # -- activity ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def activity(self, principal: Principal, cid: str) -> AsyncIterator[ContainerRecord]:
        """Use a container: wake it if asleep, keep the reaper off it, renew last_active_at."""
        record = self.get(principal, cid)
        if record.status not in LIVE:
            msg = f"container {cid} has {record.status}; create a new one"
            raise ContainerNotRunning(msg, param="container_id")
        self._busy[cid] = self._busy.get(cid, 0) + 1
        try:
            if record.status == "sleeping":
                await self.wake(record)
            self.touch(cid)
            yield record
        finally:
            self._busy[cid] -= 1
            if not self._busy[cid]:
                del self._busy[cid]
            self.touch(cid)

    def touch(self, cid: str) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(containers)
                .where(containers.c.id == cid)
                .values(last_active_at=int(time.time()))
            )

    async def wake(self, record: ContainerRecord) -> None:
        async with self._lock(record.id):
            current = self.get(Principal(record.project), record.id)
            if current.status == "sleeping":
                for hook in self.before_start_hooks:
                    await hook(record)
                await self.runtime.start(record.id)
                self._set_status(record.id, "running")
            record.status = "running"

    def _set_status(self, cid: str, status: str) -> None:
        with self.db.begin() as conn:
            conn.execute(update(containers).where(containers.c.id == cid).values(status=status))

    # -- background -------------------------------------------------------------------------

    async def reap_once(self) -> None:
        now = int(time.time())
        lc = self.settings.lifecycle
        with self.db.connect() as conn:
            rows = conn.execute(
                select(containers).where(
                    containers.c.status.in_(LIVE), containers.c.deleted.is_(False)
                )
            ).all()
        for row in rows:
            record = ContainerRecord.from_row(row._mapping)
            if record.id in self._busy:
                continue
            idle = now - record.last_active_at
            try:
                if idle >= record.expires_after_minutes * 60:
                    async with self._lock(record.id):
                        await self._end(record, "expired")
                elif record.status == "running" and idle >= lc.idle_sleep_s:
                    async with self._lock(record.id):
                        if record.id in self._busy:
                            continue
                        await self.runtime.stop(record.id)
                        self._set_status(record.id, "sleeping")
            except Exception:
                log.exception("reaper failed on container %s", record.id)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lifecycle.reaper_interval_s)
            await self.reap_once()

    def start_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="shellbox-reaper")

    async def stop_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None

    async def recover(self) -> None:
        """After a (possibly unclean) restart: adopt or restart every running container, stop
        sleeping ones, and destroy what the runtime holds that the database does not know."""
        with self.db.connect() as conn:
            rows = conn.execute(select(containers)).all()
        known = {r.id: ContainerRecord.from_row(r._mapping) for r in rows}
        for info in await self.runtime.list():
            record = known.get(info.id)
            if record is None or record.status not in LIVE:
                log.info("destroying leftover sandbox %s", info.id)
                await self.runtime.destroy(info.id)
        for record in known.values():
            if record.status == "running":
                try:
                    for hook in self.before_start_hooks:
                        await hook(record)
                    await self.runtime.start(record.id)  # adopts it when its agent answers
                except Exception:
                    log.exception("could not restart container %s; it will sleep", record.id)
                    self._set_status(record.id, "sleeping")
            elif record.status == "sleeping" and await self.runtime.state(record.id) != "absent":
                await self.runtime.stop(record.id)

    def data_dir(self, cid: str) -> Any:
        return self.runtime.data_dir(cid)


def remove_tree(path: Any) -> None:
    shutil.rmtree(path, ignore_errors=True)
