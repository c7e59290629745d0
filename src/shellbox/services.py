"""Wiring: build every service from the settings, in dependency order, and tear them down.

The one composition root. Features (apply_patch, skills, egress, responses) are built here
with the collaborators they need and attached to the core services: to container creation as
``ContainerFeature``s (``shellbox.features``), to the calls endpoint as a handler. No feature
imports this module or the service layer, and the core never imports a feature's service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any

from shellbox.cluster import ClusterRuntime, Connect, Lease
from shellbox.cluster.doomed import DoomedSweep
from shellbox.cluster.leftovers import SnapshotLeftoverSweep
from shellbox.egress.network import EgressNetwork
from shellbox.egress.service import EgressService
from shellbox.egress.service import install as install_egress
from shellbox.errors import InvalidRequest, SandboxError
from shellbox.responses.service import ResponsesService
from shellbox.sandbox import Runtime, create_runtime
from shellbox.sandbox.remote import RemoteRuntime, load_cluster_key
from shellbox.service.calls import CallService
from shellbox.service.containers import ContainerService, default_spec
from shellbox.service.files import FileService
from shellbox.service.idempotency import IdempotencyService, KeyedCreations
from shellbox.service.keys import KeyService, is_loopback
from shellbox.service.metering import MeteringService
from shellbox.service.metrics import Metrics
from shellbox.service.patching import PatchService
from shellbox.service.ports import PortService
from shellbox.service.pty import PtyService
from shellbox.service.shell import ShellLimits
from shellbox.service.signing import Signer
from shellbox.service.snapshots import SnapshotService
from shellbox.settings import Settings
from shellbox.skills import SkillService
from shellbox.skills import install as install_skills
from shellbox.store import Database, Stores, create_database, create_stores
from shellbox.store.blobs import BlobStore, SqlBlobStore

log = logging.getLogger("shellbox.services")


@dataclass
class Services:
    """Every service, built once per process by ``create_services``: the core, and the
    features (metering, apply_patch, skills, egress, responses) as typed collaborators."""

    settings: Settings
    db: Database
    stores: Stores
    runtime: Runtime
    keys: KeyService
    containers: ContainerService
    files: FileService
    calls: CallService
    limits: ShellLimits
    snapshots: SnapshotService
    idempotency: IdempotencyService
    metering: MeteringService
    patcher: PatchService
    skills: SkillService
    egress: EgressService
    responses: ResponsesService
    signer: Signer
    ports: PortService
    pty: PtyService
    # The egress namespaces and proxy of the runtime built here (None: a runtime given from
    # outside, e.g. a node's, which has its own).
    network: EgressNetwork | None = None
    # 'api': a replica in front of sandbox nodes (``cluster.role``), whose runtime is a
    # ``ClusterRuntime``: the nodes recover and sweep their own containers.
    role: str = "all"

    async def start(self) -> None:
        """Recover what a previous run left, then start background work."""
        await self.idempotency.start()
        await self.skills.start()
        if self.network is not None:
            await self.network.start()
        await self.egress.start()
        if self.role != "api":
            await self.containers.recover()
            await self.snapshots.sweep()
        self.files.start(sweep_containers=self.role != "api")
        self.containers.start_reaper()

    async def close(self) -> None:
        await self.containers.stop_reaper()
        await self.files.close()
        closers: list[Callable[[], Coroutine[Any, Any, None]]] = [
            self.responses.close,
            self.egress.close,
            self.idempotency.close,
        ]
        if self.network is not None:
            closers.insert(2, self.network.close)
        if isinstance(self.runtime, RemoteRuntime):
            closers.append(self.runtime.aclose)
        for closer in closers:  # the others must still close when one fails
            try:
                await closer()
            except Exception:
                log.exception("closing %s failed", getattr(closer, "__qualname__", closer))
        self.db.dispose()


def create_services(
    settings: Settings, runtime: Runtime | None = None, *, connect: Connect | None = None
) -> Services:
    """The one composition root: the core services, then each feature with the collaborators
    it needs, hooked into container creation and the calls endpoint. ``connect``: how an API
    replica reaches a node (default: over HTTP with the cluster key)."""
    api = settings.cluster.role == "api"
    if api:
        settings = api_settings(settings)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url())  # migrates the schema to this release's
    stores = create_stores(db)
    network = None
    if api:
        if runtime is None:
            runtime = ClusterRuntime(
                stores.nodes,
                connect or remote_nodes(settings),
                node_timeout_s=settings.cluster.node_timeout_s,
                spool_dir=settings.private_dir() / "skill-spool",
            )
    elif runtime is None and settings.cluster.node_url is not None:
        runtime = _node_runtime(settings)
    elif runtime is None:
        network = EgressNetwork(settings, stores.egress)
        runtime = create_runtime(settings, network=network)
    return _compose(settings, db, stores, runtime, network)


def remote_nodes(settings: Settings) -> Connect:
    """How an API replica reaches a registered node: ``RemoteRuntime`` at the URL it
    registered, with the cluster key."""
    assert settings.cluster.key_file is not None  # (checked by api_settings)
    key = load_cluster_key(settings.cluster.key_file)
    timeout_s = settings.cluster.node_connect_timeout_s
    ca_file = settings.cluster.node_ca_file
    return lambda node: RemoteRuntime(node.url, key, connect_timeout_s=timeout_s, ca_file=ca_file)


def _node_runtime(settings: Settings) -> RemoteRuntime:
    """The runtime of the one node ``cluster.node_url`` names."""
    cluster = settings.cluster
    assert cluster.node_url is not None
    if cluster.key_file is None:
        msg = "cluster.node_url needs cluster.key_file: the key the node expects"
        raise SandboxError(msg)
    return RemoteRuntime(
        cluster.node_url,
        load_cluster_key(cluster.key_file),
        connect_timeout_s=cluster.node_connect_timeout_s,
        ca_file=cluster.node_ca_file,
    )


def _compose(
    settings: Settings,
    db: Database,
    stores: Stores,
    runtime: Runtime,
    network: EgressNetwork | None,
) -> Services:
    """Everything above the runtime, whichever runtime it is (``network``: the egress
    collaborator of a runtime built here, whose start, stop and audit this process owns)."""
    api = settings.cluster.role == "api"
    # Uploaded bytes every API replica must reach live in the database; one server keeps
    # them in its state directory.
    blobs: BlobStore | None = SqlBlobStore(db) if api else None
    limits = ShellLimits.from_settings(settings.limits)
    keys = KeyService(stores.keys, open_allowed=is_loopback(settings.server.host))
    containers = ContainerService(settings, stores.containers, runtime, stores.snapshots)
    if api:
        # Three reaper rounds without a renewal: the holder is gone, another replica takes over.
        containers.lease = Lease(stores.leases, "reaper", 3 * settings.lifecycle.reaper_interval_s)
    files = FileService(
        settings, stores.files, stores.container_files, containers, blobs, shared_index=api
    )
    calls = CallService(containers, files, limits)
    snapshots = SnapshotService(stores.snapshots, containers)
    idempotency = IdempotencyService(
        stores.idempotency,
        settings.lifecycle.idempotency_ttl_s,
        run_file=settings.private_dir() / "run",
        heartbeat_s=settings.lifecycle.reaper_interval_s,
    )
    patcher = PatchService(containers, files)
    calls.handlers["apply_patch_call"] = patcher.apply_patch_call
    skills = install_skills(settings, stores.skills, stores.containers, runtime, blobs)
    spec = partial(default_spec, settings)
    egress = install_egress(
        settings,
        stores.egress,
        stores.containers,
        runtime,
        spec,
        flush_audit=network.ingest if network is not None else None,
    )
    # Attachment order is the order of every step: the files' index and the idempotency key
    # first, then skills' mounts, then egress's policy.
    containers.attach(files)
    containers.attach(KeyedCreations(idempotency))
    containers.each_round.append(idempotency.heartbeat)
    metering = MeteringService(settings.metering, stores.usage, Metrics(stores.stats))
    containers.attach(metering)
    containers.attach(skills.in_containers)
    containers.attach(egress, pool=("allowlist", egress.warm))
    containers.attach(snapshots)  # (its housekeeping: expiry)
    if isinstance(runtime, ClusterRuntime):
        containers.attach(DoomedSweep(runtime))  # deleted while their node was away
        # stored on a node with no row (a replica died while taking them)
        containers.attach(SnapshotLeftoverSweep(runtime, stores.snapshots))
    pty = PtyService(containers, settings.limits.max_ptys_per_container)
    containers.attach(pty)
    responses = ResponsesService(
        settings.upstream, stores.responses, containers, calls, files, metering
    )
    signer = Signer.from_file(settings.signing_key_file())
    ports = PortService(settings.ports, containers, signer)
    return Services(
        settings,
        db,
        stores,
        runtime,
        keys,
        containers,
        files,
        calls,
        limits,
        snapshots,
        idempotency,
        metering,
        patcher,
        skills,
        egress,
        responses,
        signer,
        ports,
        pty,
        network,
        settings.cluster.role,
    )


def api_settings(settings: Settings) -> Settings:
    """An API replica's settings: checked, and with no warm pool (pooled containers live on
    the nodes, which keep their own). Reads nothing and writes nothing: ``serve`` calls it
    before it opens (and so creates and migrates) any database."""
    url = settings.database_url()
    if not url.startswith("postgresql"):
        msg = (
            "cluster.role 'api' needs store.database_url to be a PostgreSQL URL: every replica "
            "and node shares that database (--database-url postgresql+psycopg://...)"
        )
        raise InvalidRequest(msg, param="database_url")
    if settings.cluster.key_file is None:
        msg = (
            "cluster.role 'api' needs cluster.key_file (--cluster-key-file FILE): the key the "
            "replicas present to the nodes"
        )
        raise InvalidRequest(msg, param="cluster.key_file")
    settings = settings.model_copy(deep=True)
    settings.lifecycle.warm_pool_size = 0
    settings.egress.warm_containers = 0
    return settings
