"""Idempotency records: one row per (project, key), claimed by one process at a time.

Every decision is one statement on the primary key or a compare-and-set on ``run``, so
concurrent requests (on one server or several) never both claim a key."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from shellbox.store.db import Database
from shellbox.store.records import IdempotencyRecord
from shellbox.store.tables import idempotency_keys as keys
from shellbox.store.tables import server_runs


class IdempotencyStore(Protocol):
    def get(self, project: str, key: str, *, expired_before: int) -> IdempotencyRecord | None: ...
    def claim(
        self, project: str, key: str, *, route: str, fingerprint: str, run: str, at: int
    ) -> bool: ...
    def take_over(self, project: str, key: str, *, old_run: str, run: str) -> bool: ...
    def finish(
        self, project: str, key: str, run: str, *, status: int, content_type: str, body: bytes
    ) -> None: ...
    def release(self, project: str, key: str, run: str) -> None: ...
    def attach(self, project: str, key: str, run: str, resource_id: str) -> None: ...
    def purge(self, before: int) -> None: ...
    def heartbeat(self, run: str, at: int) -> None: ...
    def run_seen(self, run: str) -> int | None: ...
    def forget_run(self, run: str) -> None: ...


class SqlIdempotencyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    @staticmethod
    def _key(project: str, key: str) -> tuple[Any, ...]:
        return (keys.c.project == project, keys.c.key == key)

    def get(self, project: str, key: str, *, expired_before: int) -> IdempotencyRecord | None:
        """The key's record; one created before ``expired_before`` is deleted and not
        returned."""
        where = self._key(project, key)
        with self.db.begin() as conn:
            row = conn.execute(select(keys).where(*where)).first()
            if row is not None and row.created_at < expired_before:
                conn.execute(delete(keys).where(*where, keys.c.created_at < expired_before))
                row = None
        if row is None:
            return None
        return IdempotencyRecord(
            row.route,
            row.fingerprint,
            row.state,
            row.run,
            row.resource_id,
            row.status,
            row.content_type,
            row.body,
            row.created_at,
        )

    def claim(
        self, project: str, key: str, *, route: str, fingerprint: str, run: str, at: int
    ) -> bool:
        """Insert the key as ``in_progress`` for ``run``; False if it exists already."""
        try:
            with self.db.begin() as conn:
                conn.execute(
                    insert(keys).values(
                        project=project,
                        key=key,
                        route=route,
                        fingerprint=fingerprint,
                        state="in_progress",
                        run=run,
                        created_at=at,
                    )
                )
        except IntegrityError:
            return False
        return True

    def take_over(self, project: str, key: str, *, old_run: str, run: str) -> bool:
        """Compare-and-set the claim from ``old_run`` (a process that died) to ``run``."""
        with self.db.begin() as conn:
            taken = conn.execute(
                update(keys)
                .where(*self._key(project, key), keys.c.run == old_run)
                .values(run=run, resource_id=None)
            ).rowcount
        return bool(taken)

    def finish(
        self, project: str, key: str, run: str, *, status: int, content_type: str, body: bytes
    ) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(keys)
                .where(*self._key(project, key), keys.c.run == run)
                .values(state="done", status=status, content_type=content_type, body=body)
            )

    def release(self, project: str, key: str, run: str) -> None:
        with self.db.begin() as conn:
            conn.execute(
                delete(keys).where(
                    *self._key(project, key), keys.c.run == run, keys.c.state == "in_progress"
                )
            )

    def attach(self, project: str, key: str, run: str, resource_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(keys)
                .where(*self._key(project, key), keys.c.run == run)
                .values(resource_id=resource_id)
            )

    def purge(self, before: int) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(keys).where(keys.c.created_at < before))

    # -- which runs are alive ---------------------------------------------------------------

    def heartbeat(self, run: str, at: int) -> None:
        """Record that ``run`` (a server process) is alive at ``at``."""
        with self.db.begin() as conn:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            stmt = dialect.insert(server_runs).values(run=run, seen_at=at)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[server_runs.c.run], set_={"seen_at": stmt.excluded.seen_at}
                )
            )

    def run_seen(self, run: str) -> int | None:
        """When ``run`` last reported alive (None: never, or it stopped cleanly or was
        declared dead)."""
        with self.db.connect() as conn:
            value = conn.execute(
                select(server_runs.c.seen_at).where(server_runs.c.run == run)
            ).scalar()
        return None if value is None else int(value)

    def forget_run(self, run: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(server_runs).where(server_runs.c.run == run))
