"""No name, path or symlink made by a client or a sandbox lets the server read or write outside
the container's own tree."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_helpers import shell

SHADOW = Path("/etc/shadow")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_upload_names_cannot_escape(client: Any, http: httpx.Client, cid: str) -> None:
    for name in ("../../etc/x", "/etc/passwd", "a/../../b", "..", "/mnt/data/../x", "/"):
        r = http.post(f"/v1/containers/{cid}/files", files={"file": (name, b"evil")})
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["param"] == "file"
    assert not Path("/etc/x").exists()
    # /mnt/data/<path> is accepted and lands inside.
    r = http.post(f"/v1/containers/{cid}/files", files={"file": ("/mnt/data/in/ok.txt", b"ok")})
    assert r.status_code == 200 and r.json()["path"] == "/mnt/data/in/ok.txt"
    # The Files API keeps only the base name of whatever it is given.
    f = client.files.create(file=("../../etc/y", b"y"), purpose="user_data")
    assert f.filename == "y"
    cf = client.containers.files.create(cid, file_id=f.id)
    assert cf.path == "/mnt/data/y"
    assert not Path("/etc/y").exists()


def test_symlink_to_a_host_file(client: Any, http: httpx.Client, server: Any, cid: str) -> None:
    before = _digest(SHADOW)
    # A regular file first, so it has an id; then the sandbox swaps it for a symlink.
    shell(http, cid, "echo harmless > s")
    sid = next(f.id for f in client.containers.files.list(cid) if f.path == "/mnt/data/s")
    item = shell(
        http,
        cid,
        "rm s && ln -s /etc/shadow s && ln -s /etc etcdir && ln -s /etc/shadow fresh-link",
    )
    assert item["files"] == []  # symlinks are never cited
    listed = [f.path for f in client.containers.files.list(cid)]  # must not crash
    assert listed == []
    r = http.get(f"/v1/containers/{cid}/files/{sid}/content")
    assert 400 <= r.status_code < 500, r.text
    assert b"root:" not in r.content
    # Uploading over the link replaces the link; it never writes through it.
    r = http.post(f"/v1/containers/{cid}/files", files={"file": ("s", b"overwrite")})
    assert r.status_code == 200
    assert _digest(SHADOW) == before
    out = shell(http, cid, "test -L s && echo link || cat s")
    assert out["output"][0]["stdout"] == "overwrite"
    # Through a symlinked directory: refused, nothing written in /etc.
    r = http.post(f"/v1/containers/{cid}/files", files={"file": ("etcdir/shellbox-x", b"x")})
    assert 400 <= r.status_code < 500
    assert not Path("/etc/shellbox-x").exists()
    assert _digest(SHADOW) == before


def test_symlink_into_another_container(client: Any, http: httpx.Client, server: Any) -> None:
    victim = client.containers.create(name="victim")
    attacker = client.containers.create(name="attacker")
    try:
        client.containers.files.create(victim.id, file=("secret.txt", b"victim secret"))
        victim_dir = server.data_dir(victim.id)  # as the server sees it: the links' target
        seen = server.view(victim_dir)  # the same directory, from this process
        assert (seen / "secret.txt").read_bytes() == b"victim secret"

        shell(http, attacker.id, "echo decoy > peek.txt")
        peek = next(f for f in client.containers.files.list(attacker.id))
        shell(
            http,
            attacker.id,
            f"rm peek.txt && ln -s {victim_dir}/secret.txt peek.txt && ln -s {victim_dir} other",
        )
        assert list(client.containers.files.list(attacker.id)) == []
        r = http.get(f"/v1/containers/{attacker.id}/files/{peek.id}/content")
        assert 400 <= r.status_code < 500
        assert b"victim secret" not in r.content
        with pytest.raises(openai.APIStatusError):
            client.containers.files.content.retrieve(peek.id, container_id=attacker.id)
        r = http.post(
            f"/v1/containers/{attacker.id}/files", files={"file": ("other/planted.txt", b"x")}
        )
        assert 400 <= r.status_code < 500
        r = http.post(
            f"/v1/containers/{attacker.id}/files", files={"file": ("other/secret.txt", b"x")}
        )
        assert 400 <= r.status_code < 500
        assert sorted(p.name for p in seen.iterdir()) == ["secret.txt"]
        assert (seen / "secret.txt").read_bytes() == b"victim secret"
        # A delete through the link does not reach the victim either.
        r = http.delete(f"/v1/containers/{attacker.id}/files/{peek.id}")
        assert r.status_code in (200, 404)
        assert (seen / "secret.txt").read_bytes() == b"victim secret"
    finally:
        client.containers.delete(victim.id)
        client.containers.delete(attacker.id)


def test_special_files_and_ids_in_paths(client: Any, http: httpx.Client, cid: str) -> None:
    shell(http, cid, "mkfifo pipe; ln -s /dev/zero z; echo ok > ok.txt")
    assert [f.path for f in client.containers.files.list(cid)] == ["/mnt/data/ok.txt"]
    for bad in ("..", "../../etc", "%2e%2e", "cntr_x/../y"):
        r = http.get(f"/v1/containers/{cid}/files/{bad}/content")
        assert r.status_code == 404, (bad, r.text)
    r = http.get("/v1/containers/..%2f..%2fetc/files")
    assert r.status_code == 404


# Each is refused by the kernel: one component over 255 bytes (ENAMETOOLONG), after a new
# directory and on its own, and a whole path over PATH_MAX whose components all fit.
KERNEL_REFUSED = ["new/" + "a" * 256, "b" * 256, "new/" + "/".join(["d" * 200] * 21)]


def test_names_the_kernel_refuses_are_400_everywhere_and_leave_nothing(
    http: httpx.Client, server: Any, cid: str
) -> None:
    data = server.view(server.data_dir(cid))
    before = sorted(p.name for p in data.iterdir())
    base = f"/v1/containers/{cid}"
    for name in KERNEL_REFUSED:
        answers = {
            "upload": (
                http.post(f"{base}/files", files={"file": (name, b"x")}),
                "file",
            ),
            "workspace write": (
                http.put(f"{base}/workspace/file", params={"path": name}, content=b"x"),
                "path",
            ),
            "workspace read": (http.get(f"{base}/workspace/file", params={"path": name}), "path"),
            "archive import": (
                http.put(f"{base}/workspace/archive", params={"path": name}, content=b""),
                "path",
            ),
        }
        for what, (r, param) in answers.items():
            assert r.status_code == 400, (what, name[:20], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert err["param"] == param, (what, err)
        out = http.post(
            f"{base}/calls",
            json={
                "type": "apply_patch_call",
                "call_id": "p",
                "operation": {"type": "create_file", "path": name, "diff": "+x\n"},
            },
        )
        assert out.status_code == 200, out.text[:300]
        assert out.json()["status"] == "failed" and "bytes" in out.json()["output"]
    # Nothing was made on the way: no empty 'new' directory, no temporary file.
    assert sorted(p.name for p in data.iterdir()) == before
    # The Files API keeps a base name that must later fit in /mnt/data (file_ids): refused now.
    r = http.post("/v1/files", files={"file": ("c" * 256, b"x")}, data={"purpose": "user_data"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text[:300]


def test_workspace_follows_links_inside_and_refuses_links_out(
    http: httpx.Client, server: Any, cid: str
) -> None:
    """The workspace endpoints (the SDK provider's) decide on the server: a symbolic link
    that stays in /mnt/data is followed, one that leads out is refused with its own code."""
    before = _digest(SHADOW)
    shell(
        http,
        cid,
        "echo v1 > real.txt && ln -s real.txt in.txt && ln -s /mnt/data/real.txt abs-in.txt"
        " && ln -s /etc/shadow out.txt && ln -s ../../etc up && ln -s /etc etc"
        " && ln -s /mnt/data/../../etc/shadow sneaky.txt",
    )
    base = f"/v1/containers/{cid}/workspace"
    assert http.get(f"{base}/file", params={"path": "in.txt"}).content == b"v1\n"
    r = http.put(f"{base}/file", params={"path": "abs-in.txt"}, content=b"v2\n")
    assert r.status_code == 200 and r.json()["path"] == "/mnt/data/real.txt"
    r = http.get(f"{base}/path", params={"path": "in.txt"})
    assert r.json()["path"] == "/mnt/data/real.txt"
    for path in ("out.txt", "up/shadow", "etc/shadow", "sneaky.txt", "etc/new-file"):
        for r in (
            http.get(f"{base}/file", params={"path": path}),
            http.put(f"{base}/file", params={"path": path}, content=b"x"),
            http.get(f"{base}/path", params={"path": path}),
        ):
            assert r.status_code == 400, (path, r.request.method, r.text)
            err = r.json()["error"]
            assert err["code"] == "path_outside_workspace" and err["param"] == "path", err
    out = shell(http, cid, "cat real.txt; for l in in out sneaky; do test -L $l.txt; done")
    assert out["output"][0]["stdout"] == "v2\n"
    assert _digest(SHADOW) == before
    assert not Path("/etc/new-file").exists()
