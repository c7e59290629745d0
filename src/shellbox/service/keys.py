"""API keys: each belongs to a project; stored as a SHA-256 hash, shown once at creation."""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, insert, select, update

from shellbox.errors import AuthenticationFailed, InvalidRequest, NotFound
from shellbox.ids import new_id
from shellbox.service.models import Principal
from shellbox.store import Database
from shellbox.store.tables import api_keys

KEY_PREFIX = "sk-shellbox-"
OPEN_PROJECT = "default"  # the project of every caller while no key exists (loopback only)
MAX_CACHED_KEYS = 10_000


@dataclass(frozen=True)
class ApiKey:
    id: str
    project: str
    prefix: str
    created_at: int
    revoked_at: int | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ApiKey:
        return cls(row["id"], row["project"], row["prefix"], row["created_at"], row["revoked_at"])


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class KeyService:
    """Creates, lists, revokes and checks keys.

    Checking a key is on every request's path, so a key found valid is remembered for
    ``cache_s`` seconds (default 1): a revocation, made by ``shellbox keys revoke`` in another
    process, takes effect within that time. Unknown keys are never remembered.
    """

    def __init__(self, db: Database, *, cache_s: float = 1.0) -> None:
        self.db = db
        self.cache_s = cache_s
        self._valid: dict[str, tuple[float, Principal]] = {}  # key hash -> (checked at, who)
        self._open_until = 0.0  # while monotonic() < this, no key exists (open mode)

    def create(self, project: str) -> tuple[ApiKey, str]:
        project = project.strip()
        if not project or len(project) > 128:
            msg = "a project name is 1 to 128 characters"
            raise InvalidRequest(msg, param="project")
        token = KEY_PREFIX + secrets.token_urlsafe(32)
        key = ApiKey(new_id("key_"), project, token[: len(KEY_PREFIX) + 4], int(time.time()), None)
        with self.db.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    id=key.id,
                    project=project,
                    key_hash=_hash(token),
                    prefix=key.prefix,
                    created_at=key.created_at,
                )
            )
        self._open_until = 0.0
        return key, token

    def list(self) -> list[ApiKey]:
        with self.db.connect() as conn:
            rows = conn.execute(select(api_keys).order_by(api_keys.c.seq))
            return [ApiKey.from_row(r._mapping) for r in rows]

    def revoke(self, key_id: str) -> ApiKey:
        with self.db.begin() as conn:
            result = conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=int(time.time()))
            )
            if result.rowcount == 0:
                msg = f"no active key with id {key_id!r}"
                raise NotFound(msg)
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).one()
        self._valid.clear()
        return ApiKey.from_row(row._mapping)

    def any_active(self) -> bool:
        with self.db.connect() as conn:
            n = conn.execute(
                select(func.count()).select_from(api_keys).where(api_keys.c.revoked_at.is_(None))
            ).scalar()
        return bool(n)

    def authenticate(self, token: str | None) -> Principal:
        """The caller's project from the token of an ``Authorization: Bearer <key>`` header."""
        token = (token or "").strip()
        if not token:
            msg = (
                "missing API key: send it as 'Authorization: Bearer <key>' "
                "(create one with `shellbox keys create --project NAME`)"
            )
            raise AuthenticationFailed(msg)
        now = time.monotonic()
        if now < self._open_until:
            return Principal(OPEN_PROJECT)
        digest = _hash(token)
        hit = self._valid.get(digest)
        if hit is not None and now - hit[0] < self.cache_s:
            return hit[1]
        principal = self._lookup(token, digest)
        if principal.key_id is not None:
            if len(self._valid) > MAX_CACHED_KEYS:
                self._valid.clear()
            self._valid[digest] = (now, principal)
        else:
            self._open_until = now + self.cache_s
        return principal

    def _lookup(self, token: str, digest: str) -> Principal:
        with self.db.connect() as conn:
            row = conn.execute(
                select(api_keys.c.id, api_keys.c.project, api_keys.c.revoked_at).where(
                    api_keys.c.key_hash == digest
                )
            ).first()
        if row is not None and row.revoked_at is None:
            return Principal(row.project, row.id)
        if row is None and token and not self.any_active():
            return Principal(OPEN_PROJECT)
        msg = "invalid API key: it is unknown or has been revoked"
        raise AuthenticationFailed(msg)
