"""``domain_secrets`` at rest: sealed (Fernet: AES-128-CBC + HMAC-SHA256) with a key kept in a
file outside the database, so that a copy of the database (or of its WAL) leaks no value.

Each stored entry is ``{"sealed": TOKEN}``, TOKEN the Fernet token of the entry's JSON
(``domain``, ``name``, ``value``, ``placeholder``): nothing of a secret is readable without the
key. The key file (``egress.secrets_key_file``, default ``<state_dir>/private/secrets.key``) is
created 0600 at the first start. Entries written by an older shellbox in clear text are sealed
at start (``seal_plaintext_rows``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from shellbox.errors import SandboxError
from shellbox.store import ContainerStore

log = logging.getLogger("shellbox.egress")

SEALED = "sealed"


class SecretSealer:
    def __init__(self, key: bytes, key_path: Path) -> None:
        self.fernet = Fernet(key)
        self.key_path = key_path

    def seal(self, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        return [
            {SEALED: self.fernet.encrypt(json.dumps(e, sort_keys=True).encode()).decode()}
            for e in entries
        ]

    def open(self, cid: str, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        """The entries in clear (entries still in clear pass as they are)."""
        out = []
        for e in entries:
            if SEALED not in e:
                out.append(e)
                continue
            try:
                out.append(json.loads(self.fernet.decrypt(e[SEALED].encode())))
            except InvalidToken:
                msg = (
                    f"the domain_secrets of container {cid} cannot be decrypted with the key in "
                    f"{self.key_path} (egress.secrets_key_file): it is not the key they were "
                    "sealed with"
                )
                raise SandboxError(msg) from None
        return out


def load_key(path: Path) -> bytes:
    """The key in ``path``, created (0600, in a 0700 directory) when the file is missing."""
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = Fernet.generate_key()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process made it a moment ago: use that one
            return load_key(path)
        with os.fdopen(fd, "wb") as f:
            f.write(key + b"\n")
            f.flush()
            os.fsync(f.fileno())
        log.info("created the domain_secrets key %s", path)
        return key
    except OSError as exc:
        msg = f"egress.secrets_key_file {path}: {exc.strerror}"
        raise SandboxError(msg) from None
    if os.stat(path).st_mode & 0o077:
        try:
            os.chmod(path, 0o600)
        except OSError as exc:
            log.warning("egress.secrets_key_file %s is readable by others: %s", path, exc)
    try:
        Fernet(key)
    except ValueError:
        msg = (
            f"egress.secrets_key_file {path} does not hold a Fernet key (32 url-safe base64 "
            "bytes); restore the right file, or remove it if no container has secrets"
        )
        raise SandboxError(msg) from None
    return key


def seal_plaintext_rows(store: ContainerStore, sealer: SecretSealer) -> int:
    """Seal the secrets an older shellbox stored in clear; returns how many rows changed."""
    rows = store.with_secrets()
    changed = 0
    for cid, entries in rows:
        if not isinstance(entries, list) or all(SEALED in e for e in entries):
            continue
        clear = [e for e in entries if SEALED not in e]
        sealed = [e for e in entries if SEALED in e] + sealer.seal(clear)
        store.set_secrets(cid, sealed)
        changed += 1
    if changed:
        store.scrub()  # the clear text must not stay behind in the WAL or in free pages
    if changed:
        log.info("sealed the domain_secrets of %d containers stored in clear", changed)
    return changed
