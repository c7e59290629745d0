"""Files API and container files through the official openai SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from api_helpers import error_of, shell


def test_files_upload_retrieve_content_delete(client: Any, http: httpx.Client) -> None:
    data = b"\x00binary\xffdata\n" * 1000
    f = client.files.create(file=("blob.bin", data), purpose="user_data")
    assert f.id.startswith("file-")
    assert (f.object, f.filename, f.bytes, f.purpose) == (
        "file",
        "blob.bin",
        len(data),
        "user_data",
    )
    assert f.status == "processed"
    got = client.files.retrieve(f.id)
    assert (got.id, got.bytes, got.filename) == (f.id, len(data), "blob.bin")
    assert client.files.content(f.id).read() == data
    deleted = client.files.delete(f.id)
    assert deleted.id == f.id and deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)
    r = http.get(f"/v1/files/{f.id}/content")
    assert r.status_code == 404
    assert error_of(r)["code"] == "file_not_found"


def test_files_list_pages(server: Any) -> None:
    key = server.create_key("files-paging")
    sdk = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    made = [
        sdk.files.create(file=(f"f{i}.txt", f"{i}".encode()), purpose="user_data").id
        for i in range(12)
    ]
    made.append(sdk.files.create(file=("v.png", b"png"), purpose="vision").id)
    page = sdk.files.list(limit=5, order="asc")
    assert len(page.data) == 5 and page.has_more
    assert [f.id for f in sdk.files.list(limit=5, order="asc")] == made
    assert [f.id for f in sdk.files.list(limit=5)] == made[::-1]
    assert [f.id for f in sdk.files.list(purpose="vision")] == made[-1:]
    for fid in made:
        sdk.files.delete(fid)
    assert list(sdk.files.list()) == []


def test_files_validation(http: httpx.Client) -> None:
    r = http.post("/v1/files", files={"file": ("a.txt", b"x")}, data={"purpose": "nonsense"})
    assert r.status_code == 400 and error_of(r)["param"] == "purpose"
    r = http.post("/v1/files", data={"purpose": "user_data"})
    assert r.status_code == 400 and error_of(r)["param"] == "file"
    r = http.post("/v1/files", files={"file": ("a.txt", b"x")})
    assert r.status_code == 400 and error_of(r)["param"] == "purpose"
    r = http.post("/v1/files", content=b"not multipart", headers={"content-type": "text/plain"})
    assert r.status_code == 400


def test_container_files_upload_and_command_created(
    client: Any, http: httpx.Client, cid: str
) -> None:
    up = client.containers.files.create(cid, file=("notes.txt", b"uploaded\n"))
    assert up.id.startswith("cfile_")
    assert (up.object, up.container_id, up.path, up.bytes, up.source) == (
        "container.file",
        cid,
        "/mnt/data/notes.txt",
        9,
        "user",
    )
    out = shell(http, cid, "cat notes.txt && mkdir -p out && printf made > out/result.txt")
    assert out["output"][0]["stdout"] == "uploaded\n"

    listed = {f.path: f for f in client.containers.files.list(cid)}
    assert set(listed) == {"/mnt/data/notes.txt", "/mnt/data/out/result.txt"}
    assert listed["/mnt/data/notes.txt"].id == up.id  # ids are stable across listings
    assert listed["/mnt/data/notes.txt"].source == "user"
    made = listed["/mnt/data/out/result.txt"]
    assert made.source == "assistant" and made.bytes == 4

    got = client.containers.files.retrieve(made.id, container_id=cid)
    assert (got.id, got.path, got.source) == (made.id, made.path, "assistant")
    assert client.containers.files.content.retrieve(made.id, container_id=cid).read() == b"made"
    assert client.containers.files.content.retrieve(up.id, container_id=cid).read() == b"uploaded\n"

    # Uploading a path with directories creates them; the sandbox user owns what we write.
    sub = client.containers.files.create(cid, file=("deep/er/x.txt", b"x"))
    assert sub.path == "/mnt/data/deep/er/x.txt"
    out = shell(http, cid, "stat -c %U deep/er/x.txt deep/er && echo more >> deep/er/x.txt")
    assert out["output"][0]["stdout"] == "user\nuser\n"

    client.containers.files.delete(made.id, container_id=cid)
    out = shell(http, cid, "test -e out/result.txt; echo $?")
    assert out["output"][0]["stdout"] == "1\n"
    with pytest.raises(openai.NotFoundError):
        client.containers.files.retrieve(made.id, container_id=cid)
    # A file removed inside the sandbox disappears from the list.
    shell(http, cid, "rm notes.txt")
    assert {f.path for f in client.containers.files.list(cid)} == {"/mnt/data/deep/er/x.txt"}
    with pytest.raises(openai.NotFoundError):
        client.containers.files.content.retrieve(up.id, container_id=cid)


def test_container_file_from_file_id(client: Any, http: httpx.Client, cid: str) -> None:
    f = client.files.create(file=("report.csv", b"a,b\n1,2\n"), purpose="user_data")
    cf = client.containers.files.create(cid, file_id=f.id)
    assert cf.path == "/mnt/data/report.csv" and cf.source == "user" and cf.bytes == 8
    assert shell(http, cid, "cat report.csv")["output"][0]["stdout"] == "a,b\n1,2\n"
    r = http.post(f"/v1/containers/{cid}/files", json={"file_id": "file-missing"})
    assert r.status_code == 404
    r = http.post(f"/v1/containers/{cid}/files", json={})
    assert r.status_code == 400 and error_of(r)["param"] == "file_id"
    r = http.post(
        f"/v1/containers/{cid}/files", content=b"{", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400


def test_files_api_names_stay_usable_in_a_container(
    client: Any, http: httpx.Client, cid: str
) -> None:
    """A Files API upload keeps only a usable base name, so file_ids can always copy it."""
    for name, kept in (("..", "upload"), ("dir/../x.txt", "x.txt"), (".", "upload")):
        f = client.files.create(file=(name, b"data"), purpose="user_data")
        assert f.filename == kept
        cf = client.containers.files.create(cid, file_id=f.id)
        assert cf.path == f"/mnt/data/{kept}"


def test_container_files_list_pages(client: Any, http: httpx.Client, cid: str) -> None:
    shell(http, cid, "for i in $(seq 1 23); do echo $i > f$i.txt; done")
    ids = [f.id for f in client.containers.files.list(cid, limit=10, order="asc")]
    assert len(ids) == len(set(ids)) == 23
    page = client.containers.files.list(cid, limit=10)
    assert len(page.data) == 10 and page.has_more
    assert [f.id for f in client.containers.files.list(cid, limit=7)] == ids[::-1]


def test_container_files_of_unknown_container(http: httpx.Client) -> None:
    r = http.get("/v1/containers/cntr_nope/files")
    assert r.status_code == 404 and error_of(r)["code"] == "container_not_found"
    r = http.post("/v1/containers/cntr_nope/files", files={"file": ("a", b"x")})
    assert r.status_code == 404


def test_big_trees_are_still_indexed_and_cited(client: Any, http: httpx.Client, cid: str) -> None:
    """Past a few thousand entries the scan moves off the event loop; nothing else changes."""
    make = "for d in $(seq 1 30); do mkdir -p t/$d; (cd t/$d && touch $(seq 1 100)); done"
    first = shell(http, cid, make)
    assert first["output"][0]["outcome"] == {"type": "exit", "exit_code": 0}
    assert len(first["files"]) == 10  # at most 10 citations
    second = shell(http, cid, "echo new > fresh.txt")
    assert [f["filename"] for f in second["files"]] == ["fresh.txt"]
    page = client.containers.files.list(cid, limit=100)
    assert len(page.data) == 100 and page.has_more
