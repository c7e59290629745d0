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


@dataclass(frozen=True)
class ApiKey:
    id: str
    project: str
    prefix: str
    created_at: int
    revoked_at: int | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ApiKey:
        return cls(row["id"], row["project"], row["prefix"], row["created_at"], row["revoked_at"])


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class KeyService:
    def __init__(self, db: Database) -> None:
        self.db = db

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
        return ApiKey.from_row(row._mapping)

    def any_active(self) -> bool:
        with self.db.connect() as conn:
            n = conn.execute(
                select(func.count()).select_from(api_keys).where(api_keys.c.revoked_at.is_(None))
            ).scalar()
        return bool(n)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller's project from an ``Authorization: Bearer <key>`` header."""
        if not authorization or not authorization.lower().startswith("bearer "):
            msg = (
                "missing API key: send it as 'Authorization: Bearer <key>' "
                "(create one with `shellbox keys create --project NAME`)"
            )
            raise AuthenticationFailed(msg)
        token = authorization[7:].strip()
        with self.db.connect() as conn:
            row = conn.execute(
                select(api_keys.c.id, api_keys.c.project, api_keys.c.revoked_at).where(
                    api_keys.c.key_hash == _hash(token)
                )
            ).first()
        if row is not None and row.revoked_at is None:
            return Principal(row.project, row.id)
        if row is None and token and not self.any_active():
            return Principal(OPEN_PROJECT)
        msg = "invalid API key: it is unknown or has been revoked"
        raise AuthenticationFailed(msg)
