"""Containers API through the official openai SDK: create, retrieve, list, delete."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest
from api_helpers import error_of, shell


def test_create_retrieve_delete(client: Any, http: httpx.Client) -> None:
    before = int(time.time())
    c = client.containers.create(
        name="crud", memory_limit="4g", expires_after={"anchor": "last_active_at", "minutes": 7}
    )
    assert c.id.startswith("cntr_")
    assert c.object == "container"
    assert c.name == "crud"
    assert c.status == "running"
    assert c.memory_limit == "4g"
    assert c.expires_after.anchor == "last_active_at" and c.expires_after.minutes == 7
    assert before <= c.created_at <= int(time.time())
    assert c.last_active_at >= c.created_at
    assert c.network_policy.type == "disabled"

    got = client.containers.retrieve(c.id)
    assert (got.id, got.name, got.status, got.memory_limit) == (c.id, "crud", "running", "4g")

    # The 4g limit is a real cgroup limit inside the sandbox (cgroup v1 or v2 file).
    out = shell(
        http,
        c.id,
        "cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    )
    assert int(out["output"][0]["stdout"]) == 4 << 30

    r = http.delete(f"/v1/containers/{c.id}")
    assert r.status_code == 200
    assert r.json() == {"id": c.id, "object": "container.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.containers.retrieve(c.id)
    r = http.delete(f"/v1/containers/{c.id}")
    assert r.status_code == 404
    assert error_of(r)["code"] == "container_not_found"
    r = http.post(
        f"/v1/containers/{c.id}/calls",
        json={"type": "shell_call", "call_id": "c", "action": {"commands": ["true"]}},
    )
    assert r.status_code == 404


def test_a_container_names_the_image_it_runs(client: Any, http: httpx.Client, server: Any) -> None:
    """An extension field the SDK keeps: the default profile's image, whose versions
    ``shellbox image info`` lists (probed from the image when it was built)."""
    info = json.loads(server.shellbox("image", "info"))
    assert info["profile"] == "default" and info["versions"]["node"].startswith("22.16.")
    c = client.containers.create(name="which-image")
    try:
        assert c.model_extra["image"] == {"id": info["id"], "profile": "default"}
        assert http.get(f"/v1/containers/{c.id}").json()["image"]["id"] == info["id"]
        listed = client.containers.list(limit=100).data
        assert {x.model_extra["image"]["id"] for x in listed} == {info["id"]}
    finally:
        client.containers.delete(c.id)


def test_defaults(client: Any) -> None:
    c = client.containers.create(name="defaults")
    try:
        assert c.memory_limit == "1g"
        assert c.expires_after.minutes == 20
    finally:
        client.containers.delete(c.id)


def test_list_pages_filter_and_order(client: Any, server: Any) -> None:
    # A project of its own, so other tests' containers do not interleave.
    key = server.create_key("paging")
    sdk = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    made = [sdk.containers.create(name="odd" if i % 2 else "even").id for i in range(25)]
    try:
        first = sdk.containers.list(limit=10)
        assert len(first.data) == 10 and first.has_more
        # Default order is newest first; auto-pagination walks every page.
        assert [c.id for c in sdk.containers.list(limit=10)] == made[::-1]
        assert [c.id for c in sdk.containers.list(limit=10, order="asc")] == made
        assert [c.id for c in sdk.containers.list(limit=10, order="desc")] == made[::-1]

        page = sdk.containers.list(limit=10, order="asc")
        pages = 1
        while page.has_more:
            page = page.get_next_page()
            pages += 1
        assert pages == 3

        raw = httpx.get(
            f"{server.base_url}/containers",
            params={"limit": 10, "order": "asc"},
            headers={"authorization": f"Bearer {key}"},
        ).json()
        assert raw["object"] == "list"
        assert raw["first_id"] == made[0] and raw["last_id"] == made[9] and raw["has_more"]

        odd = [c.id for c in sdk.containers.list(limit=5, name="odd", order="asc")]
        assert odd == made[1::2]
        assert [c.id for c in sdk.containers.list(name="nobody")] == []

        last = sdk.containers.list(limit=100, order="asc")
        assert not last.has_more and len(last.data) == 25
    finally:
        for c in made:
            sdk.containers.delete(c)
    assert [c.id for c in sdk.containers.list()] == []


def test_create_copies_file_ids(client: Any, http: httpx.Client) -> None:
    f1 = client.files.create(file=("one.txt", b"first file\n"), purpose="user_data")
    f2 = client.files.create(file=("two.bin", bytes(range(256)) * 3), purpose="assistants")
    c = client.containers.create(name="with-files", file_ids=[f1.id, f2.id])
    try:
        out = shell(http, c.id, "cat /mnt/data/one.txt", "wc -c < two.bin", "stat -c %U one.txt")
        assert out["output"][0]["stdout"] == "first file\n"
        assert out["output"][1]["stdout"].strip() == str(256 * 3)
        assert out["output"][2]["stdout"].strip() == "user"  # the sandbox user can modify them
        listed = {f.path: f for f in client.containers.files.list(c.id)}
        assert set(listed) == {"/mnt/data/one.txt", "/mnt/data/two.bin"}
        assert all(f.source == "user" for f in listed.values())
    finally:
        client.containers.delete(c.id)


def test_create_with_unknown_file_id_is_404_and_leaves_nothing(
    client: Any, http: httpx.Client
) -> None:
    before = {c.id for c in client.containers.list(limit=100)}
    r = http.post("/v1/containers", json={"name": "x", "file_ids": ["file-nope"]})
    assert r.status_code == 404
    assert "file-nope" in error_of(r)["message"]
    assert {c.id for c in client.containers.list(limit=100)} == before


def test_network_policy_disabled_is_stored_and_bad_type_refused(http: httpx.Client) -> None:
    r = http.post("/v1/containers", json={"name": "x", "network_policy": {"type": "disabled"}})
    assert r.status_code == 200 and r.json()["network_policy"] == {"type": "disabled"}
    http.delete(f"/v1/containers/{r.json()['id']}")
    r = http.post("/v1/containers", json={"name": "x", "network_policy": {"type": "open"}})
    assert r.status_code == 400
    assert error_of(r)["param"] == "network_policy.type"
