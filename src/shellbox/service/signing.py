"""Signed, expiring tokens: port links, browsers' query-string tokens, console sessions.

A token is ``<payload>.<mac>``, both base64url without padding: the payload is compact JSON
holding the token's purpose (``p``), its expiry (``e``, Unix seconds) and its scope (the
container, the port, the project...); the mac is HMAC-SHA256 over the purpose and the payload
with the server's signing key. Verifying compares macs in constant time, then checks the
purpose (a port link is never a console session) and the expiry.

The key (32 random bytes, hex) lives in ``ports.signing_key_file``, default
``<state_dir>/private/signing.key``: made 0600 in the 0700 private directory when missing,
never logged. Removing it (and restarting) revokes every link, token and session at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from shellbox.errors import ErrorCode, LinkRefused, SandboxError

log = logging.getLogger("shellbox.signing")

Claims = Mapping[str, str | int]
MAX_TOKEN_CHARS = 2048


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key = key
        self.clock = clock

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        return cls(load_key(path))

    def _mac(self, purpose: str, payload: str) -> bytes:
        return hmac.new(self._key, f"{purpose}.{payload}".encode(), hashlib.sha256).digest()

    def sign(self, purpose: str, claims: Claims, expires_at: int) -> str:
        body = {"p": purpose, "e": expires_at, **claims}
        payload = _b64(json.dumps(body, separators=(",", ":"), sort_keys=True).encode())
        return f"{payload}.{_b64(self._mac(purpose, payload))}"

    def derive(self, purpose: str, data: str) -> str:
        """A MAC of ``data`` for ``purpose`` (hex), e.g. a CSRF token bound to a session."""
        return self._mac(f"derive:{purpose}", data).hex()

    def verify(self, purpose: str, token: str, *, what: str = "link") -> dict[str, str | int]:
        """The token's claims; ``LinkRefused`` naming ``what`` when it was altered, made for
        another purpose, or has expired."""
        invalid = LinkRefused(
            f"this {what} is not valid: it was altered or cut short, or was made by another "
            f"server; ask for a new one"
        )
        if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
            raise invalid
        payload, mac = token.split(".")
        try:
            given = _unb64(mac)
        except (binascii.Error, ValueError):
            raise invalid from None
        if not hmac.compare_digest(given, self._mac(purpose, payload)):
            raise invalid
        try:  # signed by us: only a key shared with an older format could get here
            claims = json.loads(_unb64(payload))
        except (binascii.Error, ValueError):
            raise invalid from None
        if not isinstance(claims, dict) or claims.get("p") != purpose:
            raise invalid
        expires_at = claims.get("e")
        if not isinstance(expires_at, int) or expires_at <= self.clock():
            expired = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(expires_at or 0)))
            msg = f"this {what} expired at {expired}; ask for a new one"
            raise LinkRefused(msg, code=ErrorCode.link_expired)
        return claims


def load_key(path: Path) -> bytes:
    """The key in ``path``, made (0600, in a 0700 directory) when the file is missing."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it a moment ago: use that one
            return load_key(path)
        text = secrets.token_hex(32)
        with os.fdopen(fd, "w") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        log.info("created the signing key %s", path)
    except OSError as exc:
        msg = f"ports.signing_key_file {path}: {exc.strerror}"
        raise SandboxError(msg) from None
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o600)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        msg = (
            f"ports.signing_key_file {path} does not hold a key (64 hex digits); remove it to "
            "make a new one (every link and console session then ends)"
        )
        raise SandboxError(msg)
    return key
