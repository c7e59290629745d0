"""API keys: only their hashes are stored; rows are never deleted (revoked keys stay). Admin
keys (``shellbox keys create --admin``: they may also read the organization's usage, costs and
/metrics) are a grant per key in ``admin_keys``, written with the key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import bindparam, func, insert, select, update

from shellbox.store.db import Database
from shellbox.store.records import ApiKey
from shellbox.store.tables import admin_keys, api_keys


@dataclass(frozen=True)
class KeyMatch:
    id: str
    project: str
    revoked_at: int | None


class KeyStore(Protocol):
    def insert(self, key: ApiKey, key_hash: str, *, admin: bool = False) -> None:
        """Store a key; ``admin``: and its admin grant, in the same transaction."""
        ...

    def list(self) -> list[ApiKey]: ...
    def revoke(self, key_id: str, at: int) -> ApiKey | None: ...
    def by_hash(self, key_hash: str) -> KeyMatch | None: ...
    def any_active(self) -> bool: ...
    def any(self) -> bool: ...
    def is_admin(self, key_id: str) -> bool: ...
    def admin_ids(self) -> set[str]: ...


# Built once: on every request's path, and building the expression costs as much as running it.
_BY_HASH = select(api_keys.c.id, api_keys.c.project, api_keys.c.revoked_at).where(
    api_keys.c.key_hash == bindparam("key_hash")
)


class SqlKeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def insert(self, key: ApiKey, key_hash: str, *, admin: bool = False) -> None:
        with self.db.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    id=key.id,
                    project=key.project,
                    key_hash=key_hash,
                    prefix=key.prefix,
                    created_at=key.created_at,
                    revoked_at=key.revoked_at,
                )
            )
            if admin:
                conn.execute(insert(admin_keys).values(key_id=key.id, created_at=key.created_at))

    def list(self) -> list[ApiKey]:
        with self.db.connect() as conn:
            rows = conn.execute(select(api_keys).order_by(api_keys.c.seq))
            return [ApiKey.from_row(r._mapping) for r in rows]

    def revoke(self, key_id: str, at: int) -> ApiKey | None:
        """Revoke an active key; None if there is no active key with that id."""
        with self.db.begin() as conn:
            result = conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=at)
            )
            if result.rowcount == 0:
                return None
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).one()
        return ApiKey.from_row(row._mapping)

    def by_hash(self, key_hash: str) -> KeyMatch | None:
        row = self.db.first_row(_BY_HASH, {"key_hash": key_hash})
        return None if row is None else KeyMatch(row["id"], row["project"], row["revoked_at"])

    def any_active(self) -> bool:
        with self.db.connect() as conn:
            n = conn.execute(
                select(func.count()).select_from(api_keys).where(api_keys.c.revoked_at.is_(None))
            ).scalar()
        return bool(n)

    def any(self) -> bool:
        with self.db.connect() as conn:
            return conn.execute(select(api_keys.c.seq).limit(1)).first() is not None

    def is_admin(self, key_id: str) -> bool:
        with self.db.connect() as conn:
            row = conn.execute(select(admin_keys.c.key_id).where(admin_keys.c.key_id == key_id))
            return row.first() is not None

    def admin_ids(self) -> set[str]:
        with self.db.connect() as conn:
            return {r.key_id for r in conn.execute(select(admin_keys.c.key_id))}
