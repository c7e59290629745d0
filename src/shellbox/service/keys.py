"""API keys: each belongs to a project; stored as a SHA-256 hash, shown once at creation."""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update

from shellbox.errors import AuthenticationFailed, InvalidRequest, NotFound, PermissionDenied
from shellbox.ids import new_id
from shellbox.service.models import Principal
from shellbox.store import Database
from shellbox.store.metering import AdminKeyStore, SqlAdminKeyStore
from shellbox.store.tables import api_keys

KEY_PREFIX = "sk-shellbox-"
OPEN_PROJECT = "default"  # every caller's project in open mode (see KeyService)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


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


# Built once: on every request's path, and building the expression costs as much as running it.
_BY_HASH = select(api_keys.c.id, api_keys.c.project, api_keys.c.revoked_at).where(
    api_keys.c.key_hash == bindparam("key_hash")
)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class KeyService:
    """Creates, lists, revokes and checks keys.

    Every request looks its key up in the store (one indexed read): a key made or revoked by
    ``shellbox keys`` in another process counts from the next request, with no cache to wait
    out.

    Open mode (any bearer token is project ``default``) exists only for a server that binds a
    loopback address (``open_allowed``), hears from a loopback peer, and whose store has never
    held a key. Revoked keys keep their rows, so "never had a key" is a stored fact: revoking
    the last key closes the server for good instead of reopening it, and a key created while
    the server runs closes open mode at the next request.
    """

    def __init__(
        self, db: Database, *, open_allowed: bool = False, admins: AdminKeyStore | None = None
    ) -> None:
        self.db = db
        self.open_allowed = open_allowed
        self.admins = admins or SqlAdminKeyStore(db)
        self._ever_keyed = False  # latches: rows are never deleted, so it never goes back

    def create(self, project: str, *, admin: bool = False) -> tuple[ApiKey, str]:
        """A new key for ``project``; ``admin``: it may also read the organization's usage and
        costs and /metrics (granted in the transaction that makes the key)."""
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
            if admin:
                self.admins.grant(conn, key.id, key.created_at)
        self._ever_keyed = True
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

    def ever_had_key(self) -> bool:
        """Whether the store holds any key, active or revoked."""
        if not self._ever_keyed:
            with self.db.connect() as conn:
                self._ever_keyed = conn.execute(select(api_keys.c.seq).limit(1)).first() is not None
        return self._ever_keyed

    def authenticate(self, token: str | None, peer: str | None = None) -> Principal:
        """The caller's project from the token of an ``Authorization: Bearer <key>`` header;
        ``peer`` is the caller's address (open mode answers loopback peers only)."""
        token = (token or "").strip()
        if not token:
            msg = (
                "missing API key: send it as 'Authorization: Bearer <key>' "
                "(create one with `shellbox keys create --project NAME`)"
            )
            raise AuthenticationFailed(msg)
        if self.open_allowed and peer is not None and is_loopback(peer) and not self.ever_had_key():
            return Principal(OPEN_PROJECT)
        with self.db.connect() as conn:
            row = conn.execute(_BY_HASH, {"key_hash": _hash(token)}).first()
        if row is not None and row.revoked_at is None:
            return Principal(row.project, row.id)
        msg = (
            "invalid API key: it has been revoked"
            if row is not None
            else "invalid API key: it is unknown or has been revoked"
        )
        if not self.any_active():
            # An operator who revoked every key sees why nothing works, and what to do.
            msg += (
                "; this server has no active API key: create one with "
                "`shellbox keys create --project NAME` and send it as "
                "'Authorization: Bearer <key>'"
            )
        raise AuthenticationFailed(msg)

    def require_admin(self, principal: Principal) -> None:
        """Refuse a caller whose key is not an admin key (403, saying how to get one)."""
        if principal.key_id is not None and self.admins.is_admin(principal.key_id):
            return
        msg = (
            "this endpoint needs an admin key; a project key cannot read organization usage, "
            "costs or metrics. Create one with `shellbox keys create --admin` and send it as "
            "'Authorization: Bearer <key>' (the openai SDK: OpenAI(admin_api_key=...))"
        )
        raise PermissionDenied(msg)

    def admin_ids(self) -> set[str]:
        return self.admins.admin_ids()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, as bound or as a peer) is this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
