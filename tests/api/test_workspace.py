"""/v1/containers/{id}/workspace: files by path and tar archives, against a real server."""

from __future__ import annotations

import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def sh(http: httpx.Client, cid: str, *commands: str) -> list[dict[str, Any]]:
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={"type": "shell_call", "action": {"commands": list(commands)}},
    )
    assert r.status_code == 200, r.text
    return list(r.json()["output"])


def tar_of(entries: dict[str, bytes | None], symlinks: dict[str, str] | None = None) -> bytes:
    """A tar built in memory: ``None`` content means a directory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tf.addfile(info)
            else:
                info.size = len(data)
                info.mode = 0o644
                tf.addfile(info, io.BytesIO(data))
        for name, target in (symlinks or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


@pytest.fixture
def cid(client: Any) -> Iterator[str]:
    c = client.containers.create(name="workspace")
    yield c.id
    client.containers.delete(c.id)


def test_write_then_read_a_file_by_path(http: httpx.Client, client: Any, cid: str) -> None:
    body = b"\x00\x01binary\xffdata" * 1000
    r = http.put(
        f"/v1/containers/{cid}/workspace/file", params={"path": "deep/er/b.bin"}, content=body
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "object": "container.workspace.file",
        "path": "/mnt/data/deep/er/b.bin",
        "bytes": len(body),
    }
    # Absolute paths under /mnt/data name the same file; bytes come back unchanged.
    r = http.get(f"/v1/containers/{cid}/workspace/file", params={"path": "/mnt/data/deep/er/b.bin"})
    assert r.status_code == 200
    assert r.content == body
    r = http.get(
        f"/v1/containers/{cid}/workspace/file", params={"path": "deep/er/b.bin", "max_bytes": 5}
    )
    assert r.content == body[:5]
    # The sandbox user owns what was written (and the directories made for it) and can edit it.
    out = sh(http, cid, "stat -c %u deep deep/er deep/er/b.bin", "echo more >> deep/er/b.bin")
    assert out[0]["stdout"].split() == ["1000", "1000", "1000"]
    assert out[1]["outcome"] == {"type": "exit", "exit_code": 0}
    # The container files API sees it too.
    paths = [f.path for f in client.containers.files.list(cid)]
    assert "/mnt/data/deep/er/b.bin" in paths


def test_path_checks_are_done_by_the_server(http: httpx.Client, cid: str) -> None:
    url = f"/v1/containers/{cid}/workspace/file"
    sh(http, cid, "ln -s /etc/passwd link", "mkdir real && ln -s /etc linkdir", "echo x > real/f")
    cases = [
        ("GET", "../../../etc/passwd", 400),
        ("GET", "/etc/passwd", 400),
        ("GET", "link", 400),  # a symlink the sandbox made to a host-looking path
        ("GET", "linkdir/passwd", 400),
        ("GET", "real", 400),  # a directory, not a file
        ("GET", "missing.txt", 404),
        ("PUT", "linkdir/new", 400),
        ("PUT", "../escape.txt", 400),
        ("PUT", "real", 400),
    ]
    for method, path, status in cases:
        r = http.request(method, url, params={"path": path}, content=b"data")
        assert r.status_code == status, (method, path, r.text)
        assert r.json()["error"]["message"], r.text
    # Nothing was written through the link.
    assert sh(http, cid, "ls /etc/new 2>&1; cat real/f")[0]["stdout"].endswith("x\n")


def test_export_archive_has_relative_members_and_honours_excludes(
    http: httpx.Client, cid: str
) -> None:
    sh(
        http,
        cid,
        "mkdir -p src/pkg cache && echo one > a.txt && echo two > src/pkg/b.py",
        "echo junk > cache/big && echo keep > src/keep && echo no > src/drop",
        "chmod +x src/pkg/b.py",
    )
    r = http.get(
        f"/v1/containers/{cid}/workspace/archive", params={"exclude": ["cache", "src/drop"]}
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tf:
        names = {m.name for m in tf.getmembers()}
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]
        modes = {m.name: m.mode for m in tf.getmembers()}
    assert files == {"./a.txt": b"one\n", "./src/pkg/b.py": b"two\n", "./src/keep": b"keep\n"}
    assert not any(n.startswith("/") or ".." in n for n in names)
    assert not any("cache" in n or "drop" in n or ".shellbox" in n for n in names)
    assert modes["./src/pkg/b.py"] & 0o100
    # A subdirectory alone, and the temporary archive is gone afterwards.
    r = http.get(f"/v1/containers/{cid}/workspace/archive", params={"path": "src/pkg"})
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tf:
        assert sorted(m.name for m in tf.getmembers() if m.isfile()) == ["./b.py"]
    assert ".shellbox" not in sh(http, cid, "ls -a")[0]["stdout"]
    # Exporting leaves the tree as it was, directory times included (SDK sandboxes fingerprint
    # the workspace with tar to decide whether a resumed container needs restoring).
    stat = "stat -c '%y %n' /mnt/data /mnt/data/src"
    before = sh(http, cid, stat)[0]["stdout"]
    time.sleep(0.05)
    for params in ({}, {"path": "src"}):
        assert http.get(f"/v1/containers/{cid}/workspace/archive", params=params).is_success
    assert sh(http, cid, stat)[0]["stdout"] == before
    r = http.get(f"/v1/containers/{cid}/workspace/archive", params={"path": "nope"})
    assert r.status_code == 404, r.text
    r = http.get(f"/v1/containers/{cid}/workspace/archive", params={"exclude": ["../x"]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "exclude"


def test_import_archive_round_trips_into_another_container(
    http: httpx.Client, client: Any, cid: str
) -> None:
    sh(http, cid, "mkdir -p d/e && echo hello > d/e/f.txt && printf '\\x00\\x01' > bin")
    archive = http.get(f"/v1/containers/{cid}/workspace/archive").content
    other = client.containers.create(name="workspace-2").id
    try:
        r = http.put(
            f"/v1/containers/{other}/workspace/archive",
            params={"path": "restored"},
            content=archive,
        )
        assert r.status_code == 200, r.text
        assert r.json()["path"] == "/mnt/data/restored"
        out = sh(
            http,
            other,
            "cat restored/d/e/f.txt; od -An -tx1 restored/bin",
            "stat -c %u restored/d/e/f.txt; ls -a",
        )
        assert out[0]["stdout"].split() == ["hello", "00", "01"]
        assert out[1]["stdout"].split() == ["1000", ".", "..", "restored"]
    finally:
        client.containers.delete(other)


def test_a_hostile_archive_cannot_reach_the_host(http: httpx.Client, server: Any, cid: str) -> None:
    marker = f"shellbox-escape-{uuid.uuid4().hex}"
    archive = tar_of(
        {
            f"../../../../{marker}": b"up",
            f"/tmp/{marker}": b"absolute",
            "ok.txt": b"fine",
        },
        symlinks={"esc": "/"},
    )
    archive2 = tar_of({f"esc/tmp/{marker}": b"through a link"})
    for body in (archive, archive2):
        r = http.put(f"/v1/containers/{cid}/workspace/archive", content=body)
        assert r.status_code in (200, 400), r.text
    data_dir = server.view(server.data_dir(cid))
    assert (data_dir / "ok.txt").read_bytes() == b"fine"
    # Absolute and dotted names end up inside /mnt/data (tar strips them) or nowhere; nothing
    # lands elsewhere in the server's tree or on the host.
    tree = server.view(server.state_dir)
    outside = [p for p in tree.rglob(f"*{marker}*") if data_dir not in p.parents]
    assert outside == []
    for base in ("/tmp", "/", "/var/tmp"):
        assert not (Path(base) / marker).exists()
    # Garbage is the client's mistake: a 400 that says tar could not unpack it.
    r = http.put(f"/v1/containers/{cid}/workspace/archive", content=b"not a tar" * 100)
    assert r.status_code == 400
    assert "unpack" in r.json()["error"]["message"]


def test_other_projects_and_ended_containers(server: Any, http: httpx.Client, client: Any) -> None:
    key = server.create_key("someone-else")
    c = client.containers.create(name="mine")
    with httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {key}"}, timeout=60
    ) as stranger:
        for method, route in (
            ("GET", "file"),
            ("PUT", "file"),
            ("GET", "archive"),
            ("PUT", "archive"),
        ):
            r = stranger.request(
                method,
                f"/v1/containers/{c.id}/workspace/{route}",
                params={"path": "a"},
                content=b"",
            )
            assert r.status_code == 404, r.text
    client.containers.delete(c.id)
    r = http.get(f"/v1/containers/{c.id}/workspace/file", params={"path": "a"})
    assert r.status_code == 404
