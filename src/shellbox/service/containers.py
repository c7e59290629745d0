"""Container lifecycle: create, wake, sleep, expire, delete, and recovery after a restart.

Statuses: ``running`` (processes up), ``sleeping`` (idle past ``idle_sleep_s``: processes
frozen with their memory, or stopped with ``lifecycle.idle_sleep = "stop"``; disk kept; the
next call wakes it), ``paused`` (frozen on request, ``POST .../pause``; the next call or
``.../resume`` thaws it), ``expired`` (``expires_after`` minutes after ``last_active_at``:
processes and files gone), ``deleted`` (hidden from the API). A container may also start
from a snapshot (``snapshot_id``): its disk is then a copy-on-write copy of the snapshot's.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol

from shellbox.errors import (
    Conflict,
    ContainerNotFound,
    ContainerNotRunning,
    InvalidRequest,
    NodeUnavailable,
    QuotaExceeded,
    SandboxError,
    SnapshotNotFound,
)
from shellbox.features import ContainerFeature, PolicyType, Provisioned
from shellbox.features import CreateContainer as CreateContainer  # (re-exported: api, responses)
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, NetworkSpec, Runtime
from shellbox.sandbox.base import MEMORY_LIMIT_BYTES, MemoryLimit
from shellbox.sandbox.warm_pool import WarmPool
from shellbox.service.models import ContainerRecord, ContainerStatus, Principal
from shellbox.settings import Settings
from shellbox.store import ContainerStore, Quota, SnapshotStore, Usage
from shellbox.store.records import LIVE as LIVE  # (re-exported: workspace, responses)

log = logging.getLogger("shellbox.containers")
DEFAULT_MEMORY: MemoryLimit = "1g"
FORGET_BATCH = 500  # container ids per query of ``forget_ended``


class Lease(Protocol):
    """Background work held by one process at a time (``shellbox.cluster.Lease``)."""

    def hold(self) -> bool: ...
    def release(self) -> None: ...


class ContainerService:
    def __init__(
        self,
        settings: Settings,
        store: ContainerStore,
        runtime: Runtime,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.runtime = runtime
        self.snapshots = snapshots
        # Called at each step of every container's life, in the order attached (``attach``).
        self.features: list[ContainerFeature] = []
        self._locks: dict[str, asyncio.Lock] = {}
        self._busy: dict[str, int] = {}
        # Live containers this server has used, by id: one shared record per container, so
        # that a call, the reaper and a delete in this process see each other's changes. Every
        # call still reads the container's row (another server on the same database may have
        # ended it) and takes its status from there; status changes are written through at
        # once; last_active_at is written behind (``flush_activity``, each reaper round and at
        # shutdown; never moved back), so a crash loses at most one reaper interval of it.
        self._live: dict[str, ContainerRecord] = {}
        self._dirty: set[str] = set()
        # project -> memory limits of creations not yet in the database (once their row is
        # in, the database counts them: counting them here too refused creates below the cap)
        self._creating: dict[str, list[str]] = {}
        self._making: set[str] = set()  # ids of creations under way (no row yet, perhaps)
        self._reaper: asyncio.Task[None] | None = None
        # API replicas (``cluster.role = "api"``): the reaper's shared work (sleep, expiry,
        # features' housekeeping) runs only while this lease is held, so once across replicas;
        # None: this process is the only one (it always runs it).
        self.lease: Lease | None = None
        # What every process does each reaper round, lease or not (e.g. report itself alive).
        self.each_round: list[Callable[[], Awaitable[None]]] = []
        # Started containers kept ready, by the network policy type they serve.
        self.pools: dict[PolicyType, WarmPool] = {
            "disabled": WarmPool(
                runtime, self._default_spec_soon, settings.lifecycle.warm_pool_size
            )
        }
        # Set by the file service so file_ids are copied in at creation.
        self.copy_files: Callable[[Principal, str, list[str]], Coroutine[Any, Any, None]] | None
        self.copy_files = None

    def attach(
        self, feature: ContainerFeature, *, pool: tuple[PolicyType, WarmPool] | None = None
    ) -> None:
        """Take part in every container's life from now on (the composition root's call);
        ``pool``: containers the feature keeps ready for creations of this policy type."""
        self.features.append(feature)
        if pool is not None:
            self.pools[pool[0]] = pool[1]

    def _lock(self, cid: str) -> asyncio.Lock:
        return self._locks.setdefault(cid, asyncio.Lock())

    # -- queries ----------------------------------------------------------------------------

    def get(self, principal: Principal, cid: str) -> ContainerRecord:
        record = self.store.get(principal.project, cid)
        if record is None:
            msg = f"No container found with id '{cid}'."
            raise ContainerNotFound(msg, param="container_id")
        return self._fresh(record)

    def _fresh(self, record: ContainerRecord) -> ContainerRecord:
        """A record read from the database, with the activity not written there yet."""
        live = self._live.get(record.id)
        if live is not None and live.last_active_at > record.last_active_at:
            record.last_active_at = live.last_active_at
        return record

    def list(
        self,
        principal: Principal,
        *,
        after: str | None,
        limit: int,
        order: str,
        name: str | None = None,
    ) -> tuple[list[ContainerRecord], bool]:
        found, has_more = self.store.page(
            principal.project,
            name=name,
            after=after,
            limit=limit,
            order="asc" if order == "asc" else "desc",
        )
        return [self._fresh(r) for r in found], has_more

    def list_all(self, limit: int) -> builtins.list[ContainerRecord]:
        """Every project's containers that are not deleted, newest first (the console's
        admin view)."""
        found = [r for r in self.store.all() if r.status != "deleted"]
        found.sort(key=lambda r: r.created_at, reverse=True)
        return [self._fresh(r) for r in found[:limit]]

    def find(self, cid: str) -> ContainerRecord:
        """A container of any project, by id (the console's admin view)."""
        for record in self.store.by_ids([cid]):
            return self._fresh(record)
        msg = f"No container found with id '{cid}'."
        raise ContainerNotFound(msg, param="container_id")

    async def memory_usage(self, records: Sequence[ContainerRecord]) -> dict[str, int | None]:
        """Bytes of memory each running container holds now (None: not running)."""
        running = [r.id for r in records if r.status == "running"]
        used = await asyncio.gather(*(self.runtime.memory_usage(cid) for cid in running))
        return dict(zip(running, used, strict=True))

    # -- create / delete --------------------------------------------------------------------

    async def create(self, principal: Principal, req: CreateContainer) -> ContainerRecord:
        if req.memory_limit not in MEMORY_LIMIT_BYTES:
            msg = f"memory_limit must be one of {', '.join(MEMORY_LIMIT_BYTES)}"
            raise InvalidRequest(msg, param="memory_limit")
        self._check_quota(principal, req.memory_limit)
        # Creations under way count against the caps too, or concurrent ones could pass them.
        pending = self._creating.setdefault(principal.project, [])
        pending.append(req.memory_limit)
        counted = False

        def in_database() -> None:
            """Stop counting this creation as pending: once its row is in the database (which
            counts it from then on), or when it failed."""
            nonlocal counted
            if not counted:
                counted = True
                pending.remove(req.memory_limit)
                # Dropped as it empties, not in a later ``finally``: by then a newer creation
                # may have started a fresh list for the project, and dropping that one would
                # stop counting it against the caps.
                if not pending and self._creating.get(principal.project) is pending:
                    del self._creating[principal.project]

        try:
            return await self._create(principal, req, in_database)
        finally:
            in_database()

    async def _create(
        self, principal: Principal, req: CreateContainer, in_database: Callable[[], None]
    ) -> ContainerRecord:
        policy_type = (req.network_policy or {}).get("type", "disabled")
        if policy_type not in ("disabled", "allowlist"):
            msg = "network_policy.type must be 'disabled' or 'allowlist'"
            raise InvalidRequest(msg, param="network_policy.type")
        prov = Provisioned()
        for feature in self.features:
            feature.check(principal, req, prov)
        if req.snapshot_id is not None:
            self._snapshot_of(principal, req.snapshot_id)  # 404 before anything is allocated
        # A pooled container fits a request that asks for nothing beyond its pool's spec (but
        # env); whether the hooks add something is only known once they ran, under its id.
        pool = self.pools.get(policy_type)
        pooled = None
        if (
            pool is not None
            and req.memory_limit == DEFAULT_MEMORY
            and not req.skills
            and req.snapshot_id is None
        ):
            pooled = await pool.take()
        cid = pooled.id if pooled is not None else new_id("cntr_")
        self._making.add(cid)
        try:
            for feature in self.features:
                await feature.provision(principal, req, cid, prov)
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
                snapshot_id=req.snapshot_id,
            )
            rs = self.settings.runtime
            spec = ContainerSpec(
                id=cid,
                memory_limit=req.memory_limit,  # type: ignore[arg-type]
                pids_limit=rs.pids_limit,
                cpus=rs.cpus,
                tmp_size_mb=rs.tmp_size_mb,
                disk_limit_bytes=self.settings.disk_limit_bytes(),
                env=prov.env,
                skills=tuple(prov.skill_mounts),
                files=prov.files,
                network=prov.network,
                hosts=prov.hosts,
            )
            if pooled is not None and not _fits(pooled, spec):
                await self.runtime.destroy(cid)  # build this one as asked, under the same id
                pooled = None
            if req.snapshot_id is not None:
                await self.runtime.fork(spec, req.snapshot_id)
                if self.snapshots is not None:
                    self.snapshots.used(req.snapshot_id, now)
            elif pooled is None:
                await self.runtime.create(spec)
            elif spec != pooled:
                # env applies per command and a disk limit at once: store them
                await self.runtime.update(spec)
            # Counted and inserted in one transaction: another server creating for the same
            # project at once cannot pass the caps either.
            refused = self.store.insert_within(record, self._quota())
            if refused is not None:
                raise self._over_quota(principal, refused, req.memory_limit)
            in_database()  # the row counts against the caps from here on
            if req.file_ids and self.copy_files is not None:
                await self.copy_files(principal, cid, req.file_ids)
            for feature in self.features:
                await feature.before_start(record)
            if pooled is None:
                await self.runtime.start(cid)
        except BaseException:
            await self._discard(cid, prov)
            raise
        finally:
            self._making.discard(cid)
        self._live[cid] = dataclasses.replace(record)
        return record

    def _snapshot_of(self, principal: Principal, snapshot_id: str) -> None:
        found = (
            self.snapshots.get(principal.project, snapshot_id)
            if self.snapshots is not None
            else None
        )
        if found is None:
            msg = f"No snapshot found with id '{snapshot_id}'."
            raise SnapshotNotFound(msg, param="snapshot_id")

    async def _default_spec_soon(self, cid: str) -> ContainerSpec:
        return default_spec(self.settings, cid)

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
        # Best effort, each step on its own: the creation's own error is what the caller sees.
        try:
            await self.runtime.destroy(cid)
        except Exception:
            log.exception("undoing the creation of %s: destroying its sandbox failed", cid)
        for feature in self.features:
            try:
                await feature.release(record)
            except Exception:
                log.exception(
                    "undoing the creation of %s: releasing it in %s failed",
                    cid,
                    type(feature).__qualname__,
                )
        self.store.remove(cid)

    def _quota(self) -> Quota:
        limits = self.settings.limits
        return Quota(
            max_containers=limits.max_containers_per_project,
            max_memory_bytes=limits.max_memory_gb_per_project << 30,
            memory_bytes=dict(MEMORY_LIMIT_BYTES),
        )

    def _check_quota(self, principal: Principal, memory_limit: str) -> None:
        """Refuse early, before anything is allocated: the rows plus the creations under way
        in this process (the insert checks the rows again, atomically)."""
        counts = dict(self.store.usage(principal.project).counts)
        for m in self._creating.get(principal.project, []):
            counts[m] = counts.get(m, 0) + 1
        usage = Usage(counts)
        quota = self._quota()
        want = quota.memory_bytes[memory_limit]
        if (
            usage.containers >= quota.max_containers
            or usage.memory_bytes(quota.memory_bytes) + want > quota.max_memory_bytes
        ):
            raise self._over_quota(principal, usage, memory_limit)

    def _over_quota(self, principal: Principal, usage: Usage, memory_limit: str) -> QuotaExceeded:
        limits = self.settings.limits
        count = usage.containers
        if count >= limits.max_containers_per_project:
            msg = (
                f"project {principal.project!r} already has {count} live containers, the most "
                "it may have; delete some or wait for them to expire"
            )
            return QuotaExceeded(msg)
        used = usage.memory_bytes(dict(MEMORY_LIMIT_BYTES)) // (1 << 30)
        msg = (
            f"project {principal.project!r} uses {used} GiB of container memory; another "
            f"{memory_limit} would pass its cap of {limits.max_memory_gb_per_project} GiB"
        )
        return QuotaExceeded(msg)

    async def delete(self, principal: Principal, cid: str) -> None:
        record = self.get(principal, cid)
        async with self._lock(cid):
            await self._end(record, "deleted")

    async def _end(
        self, record: ContainerRecord, status: str, *, idle_since: int | None = None
    ) -> None:
        """Destroy processes and files; mark ``expired`` or ``deleted`` (an expired container
        that is then deleted keeps ``expired`` as its last status, hidden). ``idle_since``:
        the reaper's expiry of a container idle since then, which only the process whose
        conditional update marks it expired completes (features released, logged): of two
        API replicas at it at once, one does it."""
        was_live = record.status in LIVE
        new_status: ContainerStatus = record.status
        if was_live:
            new_status = "expired" if status == "expired" else "deleted"
        # Calls in flight (and those waiting for the lock) learn at once why their container
        # goes away, so they answer 409 rather than a sandbox error.
        self._forget_live(record.id, new_status)
        if was_live:
            for feature in self.features:
                await feature.stopping(record, new_status)
            await self.runtime.destroy(record.id)
            if idle_since is not None:
                if not self.store.transition(
                    record.id, "expired", expected=LIVE, idle_since=idle_since
                ):
                    log.info("container %s: expired by another process", record.id)
                    self._locks.pop(record.id, None)
                    return
                log.info("container %s expired", record.id)
            for feature in self.features:
                try:
                    await feature.release(record)
                except Exception:
                    log.exception(
                        "releasing container %s in %s failed", record.id, type(feature).__qualname__
                    )
        self.store.set_status(record.id, new_status, deleted=status == "deleted")
        record.status = new_status
        self._forget_live(record.id, new_status)  # claimed from the database meanwhile
        self._dirty.discard(record.id)
        self._locks.pop(record.id, None)

    def _forget_live(self, cid: str, status: ContainerStatus) -> None:
        live = self._live.pop(cid, None)
        if live is not None:
            live.status = status

    # -- activity ---------------------------------------------------------------------------

    def get_live(self, principal: Principal, cid: str) -> ContainerRecord:
        """The container, if it is running or sleeping (409 once it has expired)."""
        record = self.get(principal, cid)
        if record.status not in LIVE:
            msg = f"container {cid} has {record.status}; create a new one"
            raise ContainerNotRunning(msg, param="container_id")
        return record

    @contextlib.asynccontextmanager
    async def activity(
        self, principal: Principal, cid: str, *, wake: bool = True
    ) -> AsyncIterator[ContainerRecord]:
        """Use a container: wake it if asleep (file operations pass ``wake=False``: they only
        need its disk), keep the reaper off it, renew last_active_at."""
        record = self._claim(principal, cid)
        self._busy[cid] = self._busy.get(cid, 0) + 1
        try:
            lock = self._locks.get(cid)
            if lock is not None and lock.locked():
                async with lock:  # the reaper is putting it to sleep or ending it: wait
                    pass
            if record.status not in LIVE:
                raise self._gone(record)
            if wake and record.status in ("sleeping", "paused"):
                await self.wake(record)
            try:
                yield record
            except SandboxError:
                if record.status not in LIVE:  # deleted (or expired) under the running call
                    raise self._gone(record) from None
                raise
        finally:
            self._busy[cid] -= 1
            if not self._busy[cid]:
                del self._busy[cid]
            self._note_activity(record)

    @staticmethod
    def _gone(record: ContainerRecord) -> ContainerNotRunning:
        msg = f"container {record.id} has {record.status}; create a new one"
        return ContainerNotRunning(msg, param="container_id")

    def _claim(self, principal: Principal, cid: str) -> ContainerRecord:
        """The live container, its activity renewed. Its row is read every time (with its 404
        or 409): another server on the same database may have ended it; the record this
        process shares takes its status from there."""
        fresh = self.get_live(principal, cid)
        record = self._live.get(cid)
        if record is None or record.project != principal.project:
            record = self._live.setdefault(cid, fresh)
        else:
            record.status = fresh.status
        self._note_activity(record)
        return record

    def _note_activity(self, record: ContainerRecord) -> None:
        now = int(time.time())
        if now > record.last_active_at:
            record.last_active_at = now
            self._dirty.add(record.id)

    def touch(self, cid: str) -> None:
        """Renew last_active_at (file operations: uploads, downloads, deletes; a terminal's
        keystrokes and output)."""
        live = self._live.get(cid)
        if live is not None:
            self._note_activity(live)
            return
        self.store.touch([(cid, int(time.time()))])

    def flush_activity(self) -> None:
        """Write the activity noted in memory to the database. A container running a call
        is active for as long as the call runs: another replica's reaper, which only sees the
        database, must not put it to sleep under the call."""
        for cid in self._busy:
            live = self._live.get(cid)
            if live is not None:
                self._note_activity(live)
        dirty = [self._live[c] for c in self._dirty if c in self._live]
        self._dirty.clear()
        if not dirty:
            return
        self.store.touch([(r.id, r.last_active_at) for r in dirty])

    async def wake(self, record: ContainerRecord) -> None:
        async with self._lock(record.id):
            if record.status in ("sleeping", "paused"):  # (another call may have woken it)
                await self._thaw_or_start(record)
                self._set_status(record.id, "running")
                for feature in self.features:
                    await feature.woke(record)
            record.status = "running"

    async def _thaw_or_start(self, record: ContainerRecord) -> None:
        """Thaw a frozen container (its processes go on where they were), or start a stopped
        one from its disk (after ``idle_sleep = "stop"``, or a reboot)."""
        if await self.runtime.state(record.id) == "paused":
            await self.runtime.resume(record.id)
            return
        for feature in self.features:
            await feature.before_start(record)
        await self.runtime.start(record.id)

    async def pause(self, principal: Principal, cid: str) -> ContainerRecord:
        """Freeze the container's processes with their memory (idempotent). A sleeping
        container is frozen too, or stays stopped if it sleeps stopped; either way it is
        ``paused`` from then on."""
        record = self._claim(principal, cid)
        if cid in self._busy:  # frozen mid-call, the call would hang until a resume
            msg = f"container {cid} is running a call; pause it once the call has finished"
            raise Conflict(msg, param="container_id")
        async with self._lock(cid):
            if record.status not in LIVE:
                raise self._gone(record)
            for feature in self.features:
                await feature.stopping(record, "paused")
            if await self.runtime.state(cid) == "running":
                await self.runtime.pause(cid)
            self._set_status(cid, "paused")
            record.status = "paused"
        return record

    async def resume(self, principal: Principal, cid: str) -> ContainerRecord:
        """Thaw a paused (or sleeping) container; a running one is answered as it is."""
        async with self.activity(principal, cid) as record:
            return record

    def _set_status(self, cid: str, status: ContainerStatus) -> None:
        self.store.set_status(cid, status)
        live = self._live.get(cid)
        if live is not None:
            live.status = status

    # -- background -------------------------------------------------------------------------

    async def reap_once(self) -> None:
        self.flush_activity()
        self.forget_ended()
        for step in self.each_round:
            try:
                await step()
            except Exception:
                log.exception("reaper step %s failed", getattr(step, "__qualname__", step))
        if self.lease is not None and not self.lease.hold():
            return  # another replica does the shared work
        now = int(time.time())
        lc = self.settings.lifecycle
        for row in self.store.live():
            record = self._fresh(row)
            seen = record.last_active_at
            idle = now - seen
            expire = idle >= record.expires_after_minutes * lc.minute_s
            sleep = record.status == "running" and idle >= lc.idle_sleep_s
            if record.id in self._busy or not (expire or sleep):
                continue
            try:
                async with self._lock(record.id):
                    # Checked again under the lock: a call may have started meanwhile (calls
                    # that start from now on wait for the lock, then see the new status).
                    if record.id in self._busy or self._fresh(record).last_active_at > seen:
                        continue
                    if expire:
                        await self._end(record, "expired", idle_since=seen)
                    else:
                        await self._sleep(record, idle_since=seen)
            except NodeUnavailable as exc:  # it stays as it is until its node is back
                log.warning("reaper: %s", exc)
            except Exception:
                log.exception("reaper failed on container %s", record.id)
        for feature in self.features:
            try:
                await feature.housekeep()
            except Exception:
                log.exception("housekeeping of %s failed", type(feature).__qualname__)

    def remembered(self) -> set[str]:
        """The containers this process keeps something of in memory (here or in a feature)."""
        kept = set(self._live) | set(self._locks)
        for feature in self.features:
            kept |= feature.remembered()
        return kept

    def forget_ended(self) -> int:
        """Drop what this process keeps in memory of containers that have ended: here, that
        is done as they end (``_end``, the features' ``release``), but API replicas (or
        servers) sharing a database end containers that the others used too, and nothing
        would tell those. One query a reaper round, for what is kept; returns how many were
        forgotten. Containers in use here are kept whatever their row says."""
        kept = self.remembered() - set(self._busy) - self._making
        kept -= {cid for cid, lock in self._locks.items() if lock.locked()}
        ordered = sorted(kept)
        live: set[str] = set()
        for at in range(0, len(ordered), FORGET_BATCH):
            rows = self.store.by_ids(ordered[at : at + FORGET_BATCH])
            live |= {r.id for r in rows if r.status in LIVE}
        ended = kept - live
        for cid in ended:
            self._live.pop(cid, None)
            self._locks.pop(cid, None)
            self._dirty.discard(cid)
            for feature in self.features:
                feature.forget(cid)
        return len(ended)

    async def _sleep(self, record: ContainerRecord, *, idle_since: int) -> None:
        """Idle: freeze its processes (they keep their memory and answer after the next
        call), or with ``lifecycle.idle_sleep = "stop"`` end them (memory freed). Marked
        ``sleeping`` by a conditional update: of two API replicas at it at once (both
        freezing a frozen container changes nothing), one does it."""
        for feature in self.features:
            await feature.stopping(record, "sleeping")
        if self.settings.lifecycle.idle_sleep == "freeze":
            if await self.runtime.state(record.id) == "running":
                await self.runtime.pause(record.id)
        else:
            await self.runtime.stop(record.id)
        if self.store.transition(
            record.id, "sleeping", expected=("running",), idle_since=idle_since
        ):
            log.info("container %s fell asleep", record.id)
        else:
            [row] = self.store.by_ids([record.id]) or [record]
            if row.status == "running":  # a call on another replica came first: undo
                await self._thaw_or_start(record)
                return
        live = self._live.get(record.id)
        if live is not None:
            live.status = "sleeping"

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lifecycle.reaper_interval_s)
            try:
                await self.reap_once()
            except Exception:  # the database away for a moment: the next round tries again
                log.exception("reaper round failed")

    def start_reaper(self) -> None:
        """Start the background work: the reaper, and filling the warm pools (after
        ``recover``, which would take pooled containers for leftovers)."""
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="shellbox-reaper")
        for pool in self.pools.values():
            pool.start()

    async def stop_reaper(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        for pool in self.pools.values():
            await pool.close()
        self.flush_activity()
        if self.lease is not None:
            self.lease.release()  # another replica takes the work over at once

    async def recover(self) -> None:
        """After a (possibly unclean) restart: adopt or restart every running container, stop
        sleeping ones, and destroy what the runtime holds that the database does not know."""
        known = {r.id: r for r in self.store.all()}
        for info in await self.runtime.list():
            record = known.get(info.id)
            if record is None or record.status not in LIVE:
                log.info("destroying leftover sandbox %s", info.id)
                await self.runtime.destroy(info.id)
        for record in known.values():
            if record.status == "running":
                try:
                    if await self.runtime.state(record.id) == "paused":
                        # Frozen for a snapshot by a server that died in that instant.
                        await self.runtime.resume(record.id)
                    for feature in self.features:
                        await feature.before_start(record)
                    await self.runtime.start(record.id)  # adopts it when its agent answers
                except Exception:
                    log.exception("could not restart container %s; it will sleep", record.id)
                    self._set_status(record.id, "sleeping")
            elif record.status in ("sleeping", "paused"):
                # Frozen ones stay frozen, with their processes; others stay stopped.
                state = await self.runtime.state(record.id)
                if state not in ("absent", "paused"):
                    await self.runtime.stop(record.id)


def default_spec(settings: Settings, cid: str) -> ContainerSpec:
    """The spec of a container created with no options (what the default pool holds)."""
    rs = settings.runtime
    return ContainerSpec(
        id=cid,
        memory_limit=DEFAULT_MEMORY,
        pids_limit=rs.pids_limit,
        cpus=rs.cpus,
        tmp_size_mb=rs.tmp_size_mb,
        disk_limit_bytes=settings.disk_limit_bytes(),
    )


def _fits(pooled: ContainerSpec, wanted: ContainerSpec) -> bool:
    """Whether a pooled container can serve as ``wanted``: the same spec but for ``env``,
    which the runtime hands to each command rather than to the container at start, the disk
    limit, and a network's policy, which ``Runtime.update`` changes on the spot (a container
    with a network is pooled in a namespace of its own that reaches nothing yet)."""

    def shape(spec: ContainerSpec) -> ContainerSpec:
        network = NetworkSpec() if spec.network is not None else None
        return dataclasses.replace(spec, env={}, disk_limit_bytes=0, network=network)

    return shape(pooled) == shape(wanted)
