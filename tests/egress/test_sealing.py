"""``domain_secrets`` at rest: sealed with a key file kept outside the database; rows an older
shellbox stored in clear are sealed at start, and nothing of them stays in the files."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert, select

from shellbox.egress.sealing import SecretSealer, load_key, seal_plaintext_rows
from shellbox.errors import SandboxError
from shellbox.settings import Settings
from shellbox.store import create_database
from shellbox.store.containers import SqlContainerStore
from shellbox.store.tables import containers

VALUE = "sk-at-rest-0123456789abcdef"
ENTRY = {"domain": "api.example.test", "name": "API_KEY", "value": VALUE, "placeholder": "p-1"}


def _db_bytes(state: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (state / "private").glob("shellbox.db*"))


def _add_container(db, cid: str, secrets: list[dict[str, str]]) -> None:  # type: ignore[no-untyped-def]
    with db.begin() as conn:
        conn.execute(
            insert(containers).values(
                id=cid,
                project="p",
                name="n",
                status="running",
                created_at=0,
                last_active_at=0,
                expires_after_minutes=20,
                memory_limit="1g",
                network_policy={"type": "allowlist", "allowed_domains": ["api.example.test"]},
                secrets=secrets,
                deleted=False,
            )
        )


def test_the_key_file_is_made_once_for_root_only(tmp_path: Path) -> None:
    path = tmp_path / "private" / "secrets.key"
    key = load_key(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert load_key(path) == key  # kept, not replaced
    path.chmod(0o644)
    load_key(path)
    assert path.stat().st_mode & 0o777 == 0o600  # and put back to 0600
    path.write_text("not a key\n")
    with pytest.raises(SandboxError, match="does not hold a Fernet key"):
        load_key(path)


def test_sealed_entries_hide_everything_and_need_their_key(tmp_path: Path) -> None:
    sealer = SecretSealer(load_key(tmp_path / "a.key"), tmp_path / "a.key")
    sealed = sealer.seal([ENTRY])
    assert list(sealed[0]) == ["sealed"]
    assert VALUE not in str(sealed) and "API_KEY" not in str(sealed)
    assert sealer.open("c1", sealed) == [ENTRY]
    other = SecretSealer(load_key(tmp_path / "b.key"), tmp_path / "b.key")
    with pytest.raises(SandboxError, match=r"container c1 .*b\.key"):
        other.open("c1", sealed)


def test_plaintext_rows_are_sealed_and_leave_no_trace(tmp_path: Path) -> None:
    """A database written by an older shellbox (values in clear, in the file and its WAL)."""
    settings = Settings(state_dir=tmp_path / "state")
    db = create_database(settings.database_url())
    _add_container(db, "c-old", [ENTRY])
    _add_container(db, "c-none", [])
    assert VALUE.encode() in _db_bytes(settings.state_dir)
    sealer = SecretSealer(load_key(settings.secrets_key_file()), settings.secrets_key_file())
    assert seal_plaintext_rows(SqlContainerStore(db), sealer) == 1
    assert seal_plaintext_rows(SqlContainerStore(db), sealer) == 0  # once
    with db.connect() as conn:
        stored = conn.execute(select(containers.c.secrets).where(containers.c.id == "c-old"))
        [secrets] = stored.scalars().all()
    assert sealer.open("c-old", secrets) == [ENTRY]
    assert VALUE.encode() not in _db_bytes(settings.state_dir)
    db.dispose()
    assert VALUE.encode() not in _db_bytes(settings.state_dir)
