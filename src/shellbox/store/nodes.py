"""Sandbox nodes and what each holds: registration and heartbeats, and the placement of
containers and snapshots on them (the API role's routing table).

Times are the database's clock (PostgreSQL's ``clock_timestamp()``; SQLite, one machine: this
process's), so that whether a node is lost never depends on two machines' clocks agreeing:
the node's heartbeat and the replica's question are measured by the same clock.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from shellbox.store.db import Database
from shellbox.store.tables import nodes, placements

PlacementKind = Literal["container", "snapshot"]
# A container or snapshot deleted while its node was unavailable: its placement stays, under
# this kind, until the sandbox or the stored snapshot is removed from the node once it is
# back (``ClusterRuntime.destroy_doomed``). A doomed container still holds its memory there.
DOOMED: dict[PlacementKind, str] = {"container": "doomed_container", "snapshot": "doomed_snapshot"}
NodeState = Literal["up", "stopped"]
# Replicas placing at once take turns (PostgreSQL: this advisory lock; SQLite: its write lock),
# so two of them never both fill a node's last free memory.
PLACEMENT_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"shellbox-placement").digest()[:8], "big", signed=True
)


@dataclass(frozen=True)
class NodeRecord:
    name: str
    url: str
    state: NodeState
    memory_bytes: int
    containers: int  # as the node last reported
    info: dict[str, Any]
    registered_at_ms: int
    heartbeat_at_ms: int
    silent_ms: int  # since its last heartbeat, when this record was read

    def available(self, timeout_ms: int) -> bool:
        """Up, and heard from within ``timeout_ms``."""
        return self.state == "up" and self.silent_ms <= timeout_ms

    @classmethod
    def from_row(cls, row: Any, now_ms: int) -> NodeRecord:
        return cls(
            name=row["name"],
            url=row["url"],
            state=row["state"],
            memory_bytes=row["memory_bytes"],
            containers=row["containers"],
            info=dict(row["info"] or {}),
            registered_at_ms=row["registered_at_ms"],
            heartbeat_at_ms=row["heartbeat_at_ms"],
            silent_ms=max(0, now_ms - row["heartbeat_at_ms"]),
        )


@dataclass(frozen=True)
class NodeLoad:
    """A node as placement sees it: what its placed containers hold."""

    node: NodeRecord
    placed: int  # containers placed on it
    placed_memory_bytes: int

    @property
    def free_memory_bytes(self) -> int:
        return self.node.memory_bytes - self.placed_memory_bytes


@dataclass(frozen=True)
class Placement:
    """A container or snapshot placed on a node, as the sweep of its leftovers sees it."""

    id: str
    kind: str  # a PlacementKind, or its DOOMED kind
    age_ms: int  # since it was placed, by the database's clock


@dataclass(frozen=True)
class Refused:
    """Why nothing was placed: no node is available, or none has room."""

    loads: list[NodeLoad]  # the available nodes, none with room (empty: none available)


class NodeStore(Protocol):
    def register(self, name: str, url: str, memory_bytes: int, info: dict[str, Any]) -> None: ...
    def heartbeat(self, name: str, containers: int) -> bool: ...
    def deregister(self, name: str) -> None: ...
    def get(self, name: str) -> NodeRecord | None: ...
    def all(self) -> list[NodeRecord]: ...
    def place(
        self,
        item_id: str,
        kind: PlacementKind,
        memory_bytes: int,
        *,
        timeout_ms: int,
        on: str | None = None,
    ) -> NodeRecord | Refused: ...
    def node_of(self, item_id: str) -> NodeRecord | None: ...
    def unplace(self, item_id: str) -> None: ...
    def placed(self, node: str, kind: PlacementKind) -> list[str]: ...
    def doom(self, item_id: str) -> None: ...
    def placements(self, node: str) -> list[Placement]: ...
    def doomed(self, node: str) -> list[tuple[str, PlacementKind]]: ...


def now_ms(conn: Connection) -> int:
    """The database's clock, in milliseconds since the epoch."""
    if conn.dialect.name == "postgresql":
        value = conn.execute(
            text("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        ).scalar_one()
        return int(value)
    return int(time.time() * 1000)


class SqlNodeStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- the node's side ----------------------------------------------------------------------

    def register(self, name: str, url: str, memory_bytes: int, info: dict[str, Any]) -> None:
        """Add the node, or bring back a node of that name (a restart): up, heard from now."""
        with self.db.begin() as conn:
            at = now_ms(conn)
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            values = {
                "name": name,
                "url": url,
                "state": "up",
                "memory_bytes": memory_bytes,
                "containers": 0,
                "info": info,
                "registered_at_ms": at,
                "heartbeat_at_ms": at,
            }
            stmt = dialect.insert(nodes).values(**values)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[nodes.c.name],
                    set_={k: v for k, v in values.items() if k not in ("name", "containers")},
                )
            )

    def heartbeat(self, name: str, containers: int) -> bool:
        """The node is alive now and holds ``containers``; False when it is not registered
        (or stopped): it must register again."""
        with self.db.begin() as conn:
            at = now_ms(conn)
            done = conn.execute(
                update(nodes)
                .where(nodes.c.name == name, nodes.c.state == "up")
                .values(heartbeat_at_ms=at, containers=containers)
            )
        return bool(done.rowcount)

    def deregister(self, name: str) -> None:
        """A clean stop: nothing is placed on it until it registers again."""
        with self.db.begin() as conn:
            conn.execute(update(nodes).where(nodes.c.name == name).values(state="stopped"))

    # -- the API's side -----------------------------------------------------------------------

    def get(self, name: str) -> NodeRecord | None:
        with self.db.connect() as conn:
            at = now_ms(conn)
            row = conn.execute(select(nodes).where(nodes.c.name == name)).first()
        return None if row is None else NodeRecord.from_row(row._mapping, at)

    def all(self) -> list[NodeRecord]:
        with self.db.connect() as conn:
            at = now_ms(conn)
            rows = conn.execute(select(nodes).order_by(nodes.c.name)).all()
        return [NodeRecord.from_row(r._mapping, at) for r in rows]

    def place(
        self,
        item_id: str,
        kind: PlacementKind,
        memory_bytes: int,
        *,
        timeout_ms: int,
        on: str | None = None,
    ) -> NodeRecord | Refused:
        """Record ``item_id`` on an available node with ``memory_bytes`` free (the sum of its
        placed containers' memory limits subtracted from its capacity), the one with the
        fewest containers among them (ties: by name); ``on``: that node only (a fork goes
        where its snapshot is). Choosing and recording are one transaction under a lock."""
        with self.db.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PLACEMENT_LOCK_KEY})
            else:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            at = now_ms(conn)
            loads = [
                load
                for load in self._loads(conn, at)
                if load.node.available(timeout_ms) and (on is None or load.node.name == on)
            ]
            fitting = [load for load in loads if load.free_memory_bytes >= memory_bytes]
            if not fitting:
                return Refused(loads)
            best = min(fitting, key=lambda load: (load.placed, load.node.name))
            conn.execute(
                placements.insert().values(
                    id=item_id,
                    kind=kind,
                    node=best.node.name,
                    memory_bytes=memory_bytes,
                    created_at_ms=at,
                )
            )
        return best.node

    @staticmethod
    def _loads(conn: Connection, at: int) -> list[NodeLoad]:
        placed = (
            select(
                placements.c.node,
                func.count().label("n"),
                func.coalesce(func.sum(placements.c.memory_bytes), 0).label("memory"),
            )
            .where(placements.c.kind.in_(("container", DOOMED["container"])))
            .group_by(placements.c.node)
            .subquery()
        )
        rows = conn.execute(
            select(nodes, placed.c.n, placed.c.memory)
            .select_from(nodes.outerjoin(placed, placed.c.node == nodes.c.name))
            .order_by(nodes.c.name)
        ).all()
        return [
            NodeLoad(NodeRecord.from_row(r._mapping, at), int(r.n or 0), int(r.memory or 0))
            for r in rows
        ]

    def node_of(self, item_id: str) -> NodeRecord | None:
        """The node holding a container or snapshot (None: never placed, or destroyed); one
        indexed join, made on every routed call."""
        with self.db.connect() as conn:
            at = now_ms(conn)
            row = conn.execute(
                select(nodes)
                .select_from(placements.join(nodes, nodes.c.name == placements.c.node))
                .where(placements.c.id == item_id)
            ).first()
        return None if row is None else NodeRecord.from_row(row._mapping, at)

    def unplace(self, item_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(placements).where(placements.c.id == item_id))

    def placed(self, node: str, kind: PlacementKind) -> list[str]:
        with self.db.connect() as conn:
            return list(
                conn.scalars(
                    select(placements.c.id)
                    .where(placements.c.node == node, placements.c.kind == kind)
                    .order_by(placements.c.created_at_ms, placements.c.id)
                )
            )

    def placements(self, node: str) -> list[Placement]:
        """Everything placed on ``node``, doomed or not, with its age."""
        with self.db.connect() as conn:
            at = now_ms(conn)
            rows = conn.execute(
                select(placements.c.id, placements.c.kind, placements.c.created_at_ms).where(
                    placements.c.node == node
                )
            ).all()
        return [Placement(r.id, r.kind, max(0, at - r.created_at_ms)) for r in rows]

    def doom(self, item_id: str) -> None:
        """Deleted while its node is unavailable: removed from there once it is back."""
        with self.db.begin() as conn:
            for kind, doomed in DOOMED.items():
                conn.execute(
                    update(placements)
                    .where(placements.c.id == item_id, placements.c.kind == kind)
                    .values(kind=doomed)
                )

    def doomed(self, node: str) -> list[tuple[str, PlacementKind]]:
        """What was deleted while ``node`` was unavailable, with what it was."""
        kinds = {doomed: kind for kind, doomed in DOOMED.items()}
        with self.db.connect() as conn:
            rows = conn.execute(
                select(placements.c.id, placements.c.kind)
                .where(placements.c.node == node, placements.c.kind.in_(tuple(kinds)))
                .order_by(placements.c.created_at_ms, placements.c.id)
            ).all()
        return [(row.id, kinds[row.kind]) for row in rows]
