"""Leases: background work that must run on one process at a time, across API replicas.

A lease is held by one ``holder`` until it expires; the holder renews it each round, and
another process takes it over only once it has lapsed, so the work survives its holder's
death (``kill -9``: one TTL later) and never runs in two places while the holder lives.
Times are the database's clock (see ``store/nodes.py``).
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import delete, or_, update
from sqlalchemy.dialects import postgresql, sqlite

from shellbox.store.db import Database
from shellbox.store.nodes import now_ms
from shellbox.store.tables import leases


class LeaseStore(Protocol):
    def acquire(self, name: str, holder: str, ttl_ms: int) -> bool: ...
    def release(self, name: str, holder: str) -> None: ...
    def holder(self, name: str) -> str | None: ...


class SqlLeaseStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def acquire(self, name: str, holder: str, ttl_ms: int) -> bool:
        """Take the lease (free, lapsed, or already ours) for ``ttl_ms`` from now; False when
        another holder's has not lapsed. One conditional statement each way: of two processes
        trying at once, one wins (PostgreSQL re-checks the condition on the row the other
        updated; SQLite has one writer)."""
        with self.db.begin() as conn:
            at = now_ms(conn)
            taken = conn.execute(
                update(leases)
                .where(
                    leases.c.name == name,
                    or_(leases.c.holder == holder, leases.c.expires_at_ms < at),
                )
                .values(holder=holder, expires_at_ms=at + ttl_ms)
            )
            if taken.rowcount:
                return True
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            made = conn.execute(
                dialect.insert(leases)
                .values(name=name, holder=holder, expires_at_ms=at + ttl_ms)
                .on_conflict_do_nothing(index_elements=[leases.c.name])
                .returning(leases.c.name)  # (an insert's rowcount is -1 under psycopg)
            ).first()
            return made is not None

    def release(self, name: str, holder: str) -> None:
        """Give it up at once (a clean stop), if ``holder`` has it."""
        with self.db.begin() as conn:
            conn.execute(delete(leases).where(leases.c.name == name, leases.c.holder == holder))

    def holder(self, name: str) -> str | None:
        """Who holds it now (None: nobody, or it lapsed)."""
        with self.db.connect() as conn:
            at = now_ms(conn)
            row = conn.execute(
                leases.select().where(leases.c.name == name, leases.c.expires_at_ms >= at)
            ).first()
        return None if row is None else str(row.holder)
