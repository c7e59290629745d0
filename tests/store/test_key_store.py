"""KeyStore contract, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from shellbox.store import Stores
from shellbox.store.records import ApiKey


def test_keys_by_hash_revoke_and_history(stores: Stores) -> None:
    k = stores.keys
    assert not k.any() and not k.any_active() and k.list() == []
    k.insert(ApiKey("key_1", "p", "sk-shellbox-abcd", 100, None), "h1")
    k.insert(ApiKey("key_2", "q", "sk-shellbox-efgh", 101, None), "h2")
    with pytest.raises(IntegrityError):  # one hash, one key
        k.insert(ApiKey("key_3", "q", "sk-shellbox-ijkl", 102, None), "h2")
    match = k.by_hash("h1")
    assert match is not None and (match.id, match.project, match.revoked_at) == ("key_1", "p", None)
    assert k.by_hash("nope") is None
    revoked = k.revoke("key_1", 200)
    assert revoked == ApiKey("key_1", "p", "sk-shellbox-abcd", 100, 200)
    assert k.revoke("key_1", 300) is None  # only an active key can be revoked
    assert k.revoke("key_9", 300) is None
    assert k.by_hash("h1").revoked_at == 200  # type: ignore[union-attr]
    assert k.any_active()
    k.revoke("key_2", 201)
    assert not k.any_active() and k.any()  # revoked keys keep their rows
    assert [key.id for key in k.list()] == ["key_1", "key_2"]


def test_admin_keys_are_granted_with_the_key(stores: Stores) -> None:
    k = stores.keys
    k.insert(ApiKey("key_1", "p", "sk-shellbox-abcd", 100, None), "h1")
    k.insert(ApiKey("key_2", "admin", "sk-shellbox-efgh", 101, None), "h2", admin=True)
    assert not k.is_admin("key_1") and k.is_admin("key_2") and not k.is_admin("key_9")
    assert k.admin_ids() == {"key_2"}
    # The key cannot be written (its hash is taken): no grant is left without a key.
    with pytest.raises(IntegrityError):
        k.insert(ApiKey("key_3", "admin", "sk-shellbox-ijkl", 102, None), "h2", admin=True)
    assert k.admin_ids() == {"key_2"}
