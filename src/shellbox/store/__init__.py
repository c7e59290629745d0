"""Metadata storage: every SQL statement of shellbox, behind one repository per aggregate.

Each repository is a ``Protocol`` (what the services ask) with one SQLAlchemy Core
implementation (``Sql...Store``) that serves SQLite (the default, WAL) and PostgreSQL alike.
The schema is in ``tables`` and changes only through the migrations (``migrate``)."""

from __future__ import annotations

from dataclasses import dataclass

from shellbox.store.containers import ContainerStore, Quota, SqlContainerStore, Usage
from shellbox.store.db import Database, create_database
from shellbox.store.egress import EgressStore, SqlEgressStore
from shellbox.store.files import (
    ContainerFileStore,
    FileStore,
    SqlContainerFileStore,
    SqlFileStore,
)
from shellbox.store.idempotency import IdempotencyStore, SqlIdempotencyStore
from shellbox.store.keys import KeyStore, SqlKeyStore
from shellbox.store.leases import LeaseStore, SqlLeaseStore
from shellbox.store.metering import SqlStatsStore, SqlUsageStore, StatsStore, UsageStore
from shellbox.store.nodes import NodeRecord, NodeStore, SqlNodeStore
from shellbox.store.responses import ResponseStore, SqlResponseStore
from shellbox.store.skills import SkillStore, SqlSkillStore
from shellbox.store.snapshots import (
    SnapshotQuota,
    SnapshotRecord,
    SnapshotStore,
    SnapshotUsage,
    SqlSnapshotStore,
)


@dataclass(frozen=True)
class Stores:
    """Every repository, over one database (the composition root hands each service its own)."""

    db: Database
    containers: ContainerStore
    files: FileStore
    container_files: ContainerFileStore
    keys: KeyStore
    skills: SkillStore
    responses: ResponseStore
    egress: EgressStore
    idempotency: IdempotencyStore
    snapshots: SnapshotStore
    usage: UsageStore
    stats: StatsStore
    nodes: NodeStore
    leases: LeaseStore


def create_stores(db: Database) -> Stores:
    return Stores(
        db=db,
        containers=SqlContainerStore(db),
        files=SqlFileStore(db),
        container_files=SqlContainerFileStore(db),
        keys=SqlKeyStore(db),
        skills=SqlSkillStore(db),
        responses=SqlResponseStore(db),
        egress=SqlEgressStore(db),
        idempotency=SqlIdempotencyStore(db),
        snapshots=SqlSnapshotStore(db),
        usage=SqlUsageStore(db),
        stats=SqlStatsStore(db),
        nodes=SqlNodeStore(db),
        leases=SqlLeaseStore(db),
    )


__all__ = [
    "ContainerFileStore",
    "ContainerStore",
    "Database",
    "EgressStore",
    "FileStore",
    "IdempotencyStore",
    "KeyStore",
    "LeaseStore",
    "NodeRecord",
    "NodeStore",
    "Quota",
    "ResponseStore",
    "SkillStore",
    "SnapshotQuota",
    "SnapshotRecord",
    "SnapshotStore",
    "SnapshotUsage",
    "StatsStore",
    "Stores",
    "Usage",
    "UsageStore",
    "create_database",
    "create_stores",
]
