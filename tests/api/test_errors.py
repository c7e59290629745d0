"""The error envelope everywhere, request ids, validation, caps, health and the schema."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from api_helpers import error_of, wait_until


def test_validation_errors_are_400_naming_the_field(http: httpx.Client) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "x", "memory_limit": "2g"}, "memory_limit"),
        ({}, "name"),
        ({"name": 5}, "name"),
        (
            {"name": "x", "expires_after": {"anchor": "created_at", "minutes": 5}},
            "expires_after.anchor",
        ),
        (
            {"name": "x", "expires_after": {"anchor": "last_active_at", "minutes": 0}},
            "expires_after.minutes",
        ),
        ({"name": "x", "expires_after": {"anchor": "last_active_at"}}, "expires_after.minutes"),
        ({"name": "x", "file_ids": "file-1"}, "file_ids"),
        ({"name": "x", "file_ids": ["a", 3]}, "file_ids[1]"),
        (
            {"name": "x", "network_policy": {"type": "allowlist", "allowed_domains": 3}},
            "network_policy.allowed_domains",
        ),
    ]
    for body, param in cases:
        r = http.post("/v1/containers", json=body)
        assert r.status_code == 400, (body, r.text)
        err = error_of(r)
        assert err["param"] == param, (body, err)
        assert err["type"] == "invalid_request_error"
        assert param in err["message"], err
    r = http.get("/v1/containers", params={"limit": 0})
    assert r.status_code == 400 and error_of(r)["param"] == "limit"
    r = http.get("/v1/containers", params={"limit": 101})
    assert r.status_code == 400 and error_of(r)["param"] == "limit"
    r = http.get("/v1/containers", params={"order": "sideways"})
    assert r.status_code == 400 and error_of(r)["param"] == "order"


def test_sdk_sees_bad_request(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.containers.create(name="x", memory_limit="2g")
    assert exc.value.param == "memory_limit"  # type: ignore[attr-defined]


def test_bad_json_is_400(http: httpx.Client) -> None:
    for raw in (b"{", b"not json", b"", b"[]", b'{"name": "x"'):
        r = http.post("/v1/containers", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert "x-request-id" in r.headers
        error_of(r)


def test_unknown_routes_and_methods(http: httpx.Client) -> None:
    for path in ("/v1/nothing", "/containers", "/v1/containers/x/y/z/w"):
        r = http.get(path)
        assert r.status_code == 404, path
        assert "/v1" in error_of(r)["message"]
        assert "x-request-id" in r.headers
    r = http.put("/v1/containers")
    assert r.status_code == 405
    error_of(r)


def test_request_id_on_every_response(http: httpx.Client, server: Any) -> None:
    seen = set()
    for r in (
        http.get("/healthz"),
        http.get("/v1/containers"),
        http.get("/v1/containers/cntr_x"),
        httpx.get(f"{server.base_url}/containers"),
        http.get("/openapi.json"),
    ):
        rid = r.headers.get("x-request-id")
        assert rid and rid.startswith("req_")
        seen.add(rid)
    assert len(seen) == 5


def test_healthz_and_openapi(http: httpx.Client, server: Any) -> None:
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert httpx.get(f"{server.root_url}/healthz").status_code == 200  # no key needed
    schema = http.get("/openapi.json").json()
    paths = schema["paths"]
    for path in (
        "/v1/containers",
        "/v1/containers/{container_id}",
        "/v1/containers/{container_id}/calls",
        "/v1/containers/{container_id}/files",
        "/v1/containers/{container_id}/files/{file_id}",
        "/v1/containers/{container_id}/files/{file_id}/content",
        "/v1/files",
        "/v1/files/{file_id}",
        "/v1/files/{file_id}/content",
    ):
        assert path in paths, path
    assert schema["components"]["securitySchemes"]["bearer_auth"]["scheme"] == "bearer"


def test_upload_size_cap_is_413(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_LIMITS__UPLOAD_MAX_BYTES": "1000"})
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    c = sdk.containers.create(name="cap")
    assert sdk.containers.files.create(c.id, file=("ok.bin", b"x" * 1000)).bytes == 1000
    for size in (1001, 3 << 20):  # just over the cap, and over the whole-body limit
        with pytest.raises(openai.APIStatusError) as exc:
            sdk.containers.files.create(c.id, file=("big.bin", b"x" * size))
        assert exc.value.status_code == 413, size
        assert "1000 byte" in exc.value.message
        with pytest.raises(openai.APIStatusError) as exc:
            sdk.files.create(file=("big.bin", b"x" * size), purpose="user_data")
        assert exc.value.status_code == 413
    r = httpx.post(
        f"{srv.base_url}/containers/{c.id}/files",
        files={"file": ("big.bin", b"x" * (3 << 20))},
        headers={"authorization": "Bearer k"},
    )
    assert r.status_code == 413 and "x-request-id" in r.headers
    assert error_of(r)["code"] == "payload_too_large"

    # Chunked (no content-length): the cap applies while the body arrives.
    def multipart() -> Any:
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="c.bin"\r\n\r\n'
        for _ in range(100):
            yield b"x" * (1 << 10)
        yield b"\r\n--b--\r\n"

    r = httpx.post(
        f"{srv.base_url}/containers/{c.id}/files",
        content=multipart(),
        headers={"authorization": "Bearer k", "content-type": "multipart/form-data; boundary=b"},
    )
    assert r.status_code == 413, r.text
    assert error_of(r)["code"] == "payload_too_large"
    # Nothing of the refused uploads is left behind.
    assert [f.path for f in sdk.containers.files.list(c.id)] == ["/mnt/data/ok.bin"]
    assert list(sdk.files.list()) == []
    sdk.containers.delete(c.id)
    srv.stop()


def _try_create(sdk: openai.OpenAI, name: str) -> str | int:
    try:
        return sdk.containers.create(name=name).id
    except openai.RateLimitError:
        return 429


def test_per_project_caps_are_429(server_factory: Any) -> None:
    srv = server_factory(
        env={
            "SHELLBOX_LIMITS__MAX_CONTAINERS_PER_PROJECT": "2",
            "SHELLBOX_LIMITS__MAX_MEMORY_GB_PER_PROJECT": "5",
        }
    )
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    # Concurrent creations cannot slip past the cap together.
    with ThreadPoolExecutor(5) as pool:
        outcomes = list(pool.map(lambda i: _try_create(sdk, f"race{i}"), range(5)))
    made = [o for o in outcomes if o != 429]
    assert len(made) == 2 and outcomes.count(429) == 3, outcomes
    for cid in made:
        sdk.containers.delete(cid)

    a = sdk.containers.create(name="a", memory_limit="4g")
    with pytest.raises(openai.RateLimitError) as exc:
        sdk.containers.create(name="b", memory_limit="4g")
    assert "4 GiB" in exc.value.message and "5 GiB" in exc.value.message
    assert exc.value.response.headers.get("x-should-retry") == "false"
    b = sdk.containers.create(name="b", memory_limit="1g")
    with pytest.raises(openai.RateLimitError) as exc:
        sdk.containers.create(name="c")
    assert "2 live containers" in exc.value.message
    sdk.containers.delete(a.id)  # deleting frees the slot
    sdk.containers.delete(b.id)
    sdk.containers.create(name="d", memory_limit="4g")
    srv.stop()


def test_a_container_still_starting_is_counted_once(server_factory: Any) -> None:
    srv = server_factory(
        env={
            "SHELLBOX_LIMITS__MAX_CONTAINERS_PER_PROJECT": "2",
            "SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0",
        }
    )
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    # A large file to copy in keeps the first creation busy after its row is written.
    big = sdk.files.create(file=("big.bin", b"\0" * (300 << 20)), purpose="user_data")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(sdk.containers.create, name="slow", file_ids=[big.id])
        assert wait_until(lambda: len(list(sdk.containers.list())) == 1, 30)
        still_creating = not first.done()
        second = sdk.containers.create(name="second")  # 1 of 2: under the cap
        assert still_creating  # (else this test proved nothing)
        assert first.result().id != second.id
    srv.stop()
