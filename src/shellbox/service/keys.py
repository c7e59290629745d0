"""API keys: each belongs to a project; stored as a SHA-256 hash, shown once at creation."""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import time

from shellbox.errors import AuthenticationFailed, InvalidRequest, NotFound, PermissionDenied
from shellbox.ids import new_id
from shellbox.service.models import Principal
from shellbox.store import KeyStore
from shellbox.store.records import ApiKey

__all__ = ["KEY_PREFIX", "OPEN_PROJECT", "ApiKey", "KeyService", "is_loopback"]

KEY_PREFIX = "sk-shellbox-"
OPEN_PROJECT = "default"  # every caller's project in open mode (see KeyService)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


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

    def __init__(self, store: KeyStore, *, open_allowed: bool = False) -> None:
        self.store = store
        self.open_allowed = open_allowed
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
        self.store.insert(key, _hash(token), admin=admin)
        self._ever_keyed = True
        return key, token

    def list(self) -> list[ApiKey]:
        return self.store.list()

    def revoke(self, key_id: str) -> ApiKey:
        key = self.store.revoke(key_id, int(time.time()))
        if key is None:
            msg = f"no active key with id {key_id!r}"
            raise NotFound(msg)
        return key

    def is_active(self, key_id: str) -> bool:
        """Whether the key exists and is not revoked (the console's sessions end with it)."""
        return any(k.id == key_id and k.revoked_at is None for k in self.store.list())

    def any_active(self) -> bool:
        return self.store.any_active()

    def ever_had_key(self) -> bool:
        """Whether the store holds any key, active or revoked."""
        if not self._ever_keyed:
            self._ever_keyed = self.store.any()
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
        row = self.store.by_hash(_hash(token))
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
        if principal.key_id is not None and self.store.is_admin(principal.key_id):
            return
        msg = (
            "this endpoint needs an admin key; a project key cannot read organization usage, "
            "costs or metrics. Create one with `shellbox keys create --admin` and send it as "
            "'Authorization: Bearer <key>' (the openai SDK: OpenAI(admin_api_key=...))"
        )
        raise PermissionDenied(msg)

    def admin_ids(self) -> set[str]:
        return self.store.admin_ids()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, as bound or as a peer) is this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
