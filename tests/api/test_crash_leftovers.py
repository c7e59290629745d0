"""What an upload cut off by a crash leaves is removed when the server starts again."""

from __future__ import annotations

import os
import time
from typing import Any

import httpx
from api_helpers import WAIT_S, shell, wait_until


def test_restart_removes_upload_leftovers(server_factory: Any) -> None:
    first = server_factory()
    http = httpx.Client(base_url=first.root_url, headers={"authorization": "Bearer k"}, timeout=60)
    cid = http.post("/v1/containers", json={"name": "crashed"}).json()["id"]
    # What write_file leaves when the process dies mid-upload: a root-owned temporary next to
    # the target (the sandbox sees it owned by nobody), here at the top and in a subdirectory.
    shell(http, cid, "mkdir -p sub/deeper && echo mine > .shellbox-upload-mine")
    # The containers' disks are mounted in the server's own mount namespace (storage.py).
    data = first.view(first.data_dir(cid))
    names = [".shellbox-upload-1234-0", "sub/deeper/.shellbox-upload-99-7"]
    for name in names:
        (data / name).write_bytes(b"partial")
    blob_tmp = first.state_dir / "files" / ".upload-abc123"
    blob_tmp.write_bytes(b"partial")  # fresh: the hourly purge would keep it for an hour
    first.kill()
    http.close()

    started = time.monotonic()
    second = server_factory(state_dir=first.state_dir)
    data = second.view(second.data_dir(cid))
    leftovers = [data / name for name in names]
    http2 = httpx.Client(base_url=second.root_url, headers={"authorization": "Bearer k"})
    assert not blob_tmp.exists()  # before the server answered its first request
    assert wait_until(lambda: not any(p.exists() for p in leftovers), WAIT_S), os.listdir(data)
    assert time.monotonic() - started < 30
    # The sandbox's own file of that name (owned by the sandbox user) is left alone, and the
    # container's files and uploads work as before.
    assert (data / ".shellbox-upload-mine").read_text() == "mine\n"
    r = http2.post(f"/v1/containers/{cid}/files", files={"file": ("sub/up.txt", b"up")})
    assert r.status_code == 200, r.text
    paths = {f["path"] for f in http2.get(f"/v1/containers/{cid}/files").json()["data"]}
    assert "/mnt/data/sub/up.txt" in paths
    assert not any(".shellbox-upload-" in p for p in paths)
    assert "upload leftovers: removed 2" in second.log()
    http2.close()
