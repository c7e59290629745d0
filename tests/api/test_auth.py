"""Keys, tenancy, and the open (keyless) mode that only listens on loopback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_helpers import error_of, shell

from shellbox.errors import AuthenticationFailed
from shellbox.service.keys import OPEN_PROJECT, KeyService
from shellbox.store import create_database
from shellbox.store.keys import SqlKeyStore


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _refused(sdk: openai.OpenAI) -> bool:
    try:
        sdk.containers.list()
    except openai.AuthenticationError:
        return True
    return False


def test_missing_wrong_and_revoked_keys_are_401(server: Any) -> None:
    url = f"{server.base_url}/containers"
    r = httpx.get(url)
    assert r.status_code == 401
    err = error_of(r)
    assert err["type"] == "authentication_error" and "Authorization: Bearer" in err["message"]
    assert "x-request-id" in r.headers
    for header in ("Bearer sk-shellbox-wrong", "Basic abc", "Bearer", "sk-shellbox-nobearer"):
        r = httpx.get(url, headers={"authorization": header})
        assert r.status_code == 401, header
        assert error_of(r)["code"] == "invalid_api_key"

    key = server.create_key("revokable")
    sdk = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    assert list(sdk.containers.list()) == []
    listing = server.shellbox("keys", "list")
    key_id = next(line.split("\t")[0] for line in listing.splitlines() if "\trevokable\t" in line)
    assert key not in listing  # only a prefix is ever shown again
    assert "active" in next(line for line in listing.splitlines() if line.startswith(key_id))
    server.shellbox("keys", "revoke", key_id)
    # Revoked in another process: refused from the very next request (no cache to wait out).
    with pytest.raises(openai.AuthenticationError) as exc:
        sdk.containers.list()
    assert exc.value.status_code == 401
    assert "revoked" in exc.value.message
    listing = server.shellbox("keys", "list")
    assert "revoked" in next(line for line in listing.splitlines() if line.startswith(key_id))
    # Revoking twice, or an unknown id, is a clear error with a non-zero exit.
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "shellbox.cli",
            "keys",
            "revoke",
            key_id,
            "--state-dir",
            str(server.state_dir),
        ],
        capture_output=True,
        text=True,
        env=server.cli_env(),
    )
    assert again.returncode != 0 and key_id in again.stderr


def test_keys_are_stored_hashed(server: Any) -> None:
    key = server.create_key("hashed")
    raw = server.database_bytes()
    assert key.encode() not in raw


def test_tenant_isolation(client: Any, server: Any, http: httpx.Client) -> None:
    other_key = server.create_key("tenant-b")
    other = openai.OpenAI(base_url=server.base_url, api_key=other_key, max_retries=0)
    ohttp = httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {other_key}"}, timeout=60
    )
    c = client.containers.create(name="mine")
    f = client.files.create(file=("secret.txt", b"A's data"), purpose="user_data")
    cf = client.containers.files.create(c.id, file=("in.txt", b"A's container data"))
    try:
        for call in (
            lambda: other.containers.retrieve(c.id),
            lambda: other.containers.delete(c.id),
            lambda: other.containers.files.list(c.id),
            lambda: other.containers.files.retrieve(cf.id, container_id=c.id),
            lambda: other.containers.files.content.retrieve(cf.id, container_id=c.id),
            lambda: other.containers.files.delete(cf.id, container_id=c.id),
            lambda: other.containers.files.create(c.id, file=("x.txt", b"x")),
            lambda: other.files.retrieve(f.id),
            lambda: other.files.content(f.id),
            lambda: other.files.delete(f.id),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        r = ohttp.post(
            f"/v1/containers/{c.id}/calls",
            json={"type": "shell_call", "call_id": "x", "action": {"commands": ["id"]}},
        )
        assert r.status_code == 404
        # Exactly like a container that does not exist.
        r_missing = ohttp.get("/v1/containers/cntr_000000000000000000000000")
        r_foreign = ohttp.get(f"/v1/containers/{c.id}")
        assert r_missing.status_code == r_foreign.status_code == 404
        assert error_of(r_foreign)["code"] == error_of(r_missing)["code"]
        # B cannot use A's file in its own container either.
        r = ohttp.post("/v1/containers", json={"name": "b", "file_ids": [f.id]})
        assert r.status_code == 404
        bc = other.containers.create(name="theirs")
        r = ohttp.post(f"/v1/containers/{bc.id}/files", json={"file_id": f.id})
        assert r.status_code == 404
        other.containers.delete(bc.id)
        assert c.id not in {x.id for x in other.containers.list()}
        assert f.id not in {x.id for x in other.files.list()}
        # A still sees everything it owns, untouched.
        assert client.containers.retrieve(c.id).status == "running"
        assert client.files.content(f.id).read() == b"A's data"
        assert shell(http, c.id, "cat in.txt")["output"][0]["stdout"] == "A's container data"
    finally:
        ohttp.close()
        client.containers.delete(c.id)
        client.files.delete(f.id)


def test_open_mode_accepts_any_bearer_on_loopback(server_factory: Any) -> None:
    srv = server_factory()
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="anything-at-all", max_retries=0)
    c = sdk.containers.create(name="open")
    other = openai.OpenAI(base_url=srv.base_url, api_key="another-token", max_retries=0)
    assert other.containers.retrieve(c.id).id == c.id  # one shared project while keyless
    assert httpx.get(f"{srv.base_url}/containers").status_code == 401  # still needs a bearer
    sdk.containers.delete(c.id)
    # A key created by another process closes open mode at the next request.
    key = srv.create_key("first")
    assert _refused(sdk)
    assert list(openai.OpenAI(base_url=srv.base_url, api_key=key).containers.list()) == []
    srv.stop()


def _key_id(srv: Any, project: str) -> str:
    listing = srv.shellbox("keys", "list")
    return next(line.split("\t")[0] for line in listing.splitlines() if f"\t{project}\t" in line)


def test_revoking_the_last_key_never_reopens_the_server(server_factory: Any) -> None:
    srv = server_factory(start=False)
    key = srv.create_key("only")
    srv.start()
    assert httpx.get(f"{srv.base_url}/containers", headers=_bearer(key)).status_code == 200
    # Revoked by another process (here: this one, on the server's store) right after a
    # successful request: refused from the very next request, no cache to wait out.
    store = create_database(srv.database_url)
    try:
        KeyService(SqlKeyStore(store)).revoke(_key_id(srv, "only"))
    finally:
        store.dispose()
    for token in ("anything", key):
        r = httpx.get(f"{srv.base_url}/containers", headers=_bearer(token))
        assert r.status_code == 401, (token, r.text)
        # The operator who revoked every key is told what to do.
        message = error_of(r)["message"]
        assert "no active API key" in message and "shellbox keys create" in message, message
    r = httpx.post(f"{srv.base_url}/containers", headers=_bearer("anything"), json={"name": "x"})
    assert r.status_code == 401
    r = httpx.post(
        f"{srv.root_url}/v1/messages",
        headers={"x-api-key": "anything"},
        json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 401
    # Durable: a restarted server still remembers that it had keys.
    srv.stop()
    srv.start()
    assert httpx.get(f"{srv.base_url}/containers", headers=_bearer("x")).status_code == 401
    assert "every API key has been revoked" in srv.log()  # said at start-up too
    # A key created in another process works at once, without a restart.
    fresh = srv.create_key("again")
    assert httpx.get(f"{srv.base_url}/containers", headers=_bearer(fresh)).status_code == 200
    assert httpx.get(f"{srv.base_url}/containers", headers=_bearer("x")).status_code == 401
    srv.stop()


def test_open_mode_needs_a_loopback_bind_and_a_loopback_peer(tmp_path: Path) -> None:
    db = create_database(f"sqlite:///{tmp_path}/keys.db")
    try:
        closed = KeyService(SqlKeyStore(db), open_allowed=False)  # bound to a non-loopback address
        with pytest.raises(AuthenticationFailed):
            closed.authenticate("anything", "127.0.0.1")
        keyless = KeyService(SqlKeyStore(db), open_allowed=True)
        assert keyless.authenticate("anything", "127.0.0.1").project == OPEN_PROJECT
        assert keyless.authenticate("anything", "::1").project == OPEN_PROJECT
        for peer in ("192.0.2.7", "::ffff:192.0.2.7", None):
            with pytest.raises(AuthenticationFailed):
                keyless.authenticate("anything", peer)
        # Another process (another service on the same store) creates a key: closed at once.
        KeyService(SqlKeyStore(db)).create("p")
        with pytest.raises(AuthenticationFailed):
            keyless.authenticate("anything", "127.0.0.1")
    finally:
        db.dispose()


def test_open_mode_refuses_non_loopback(server_factory: Any) -> None:
    srv = server_factory(start=False, args=["--host", "0.0.0.0"])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shellbox.cli",
            "serve",
            "--state-dir",
            str(srv.state_dir),
            "--port",
            str(srv.port),
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=srv._env(),
    )
    assert proc.returncode != 0
    assert "refusing to listen on 0.0.0.0" in proc.stderr
    assert "keys create" in proc.stderr
