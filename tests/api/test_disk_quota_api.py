"""limits.disk_gb through the API: a container from the warm pool has the quota, a write
past it fails inside, and an upload past it is a 413 naming the quota, not a 500."""

from __future__ import annotations

import os
from typing import Any

import httpx
import openai
from api_helpers import error_of, shell

QUOTA_GB = "0.03125"  # 32 MiB
MiB = 1 << 20
KERNEL = tuple(int(n) for n in os.uname().release.split(".")[:2])


def test_the_disk_quota_holds_for_commands_uploads_and_patches(server_factory: Any) -> None:
    srv = server_factory(
        env={"SHELLBOX_LIMITS__DISK_GB": QUOTA_GB, "SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "1"}
    )
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    http = httpx.Client(base_url=srv.root_url, headers={"authorization": "Bearer k"}, timeout=60)
    mode = "simple" if KERNEL >= (6, 7) else "qgroup"  # simple quotas need Linux 6.7+
    assert http.get("/healthz").json()["disk_quota"] == mode
    assert f"{mode} quotas" in srv.log()  # the start-up log says it too
    c = sdk.containers.create(name="small-disk")
    out = shell(http, c.id, "fallocate -l 20M a", "fallocate -l 20M ~/b")
    assert out["output"][0]["outcome"] == {"type": "exit", "exit_code": 0}
    assert "Disk quota exceeded" in out["output"][1]["stderr"], out

    r = http.post(f"/v1/containers/{c.id}/files", files={"file": ("up.bin", b"\0" * (20 * MiB))})
    assert r.status_code == 413, r.text
    err = error_of(r)
    assert err["code"] == "disk_quota_exceeded" and err["param"] == "file"
    assert "limits.disk_gb" in err["message"]
    r = http.put(
        f"/v1/containers/{c.id}/workspace/file",
        params={"path": "w.bin"},
        content=b"\0" * (20 * MiB),
    )
    assert r.status_code == 413 and error_of(r)["param"] == "path", r.text
    patch = {
        "type": "apply_patch_call",
        "call_id": "call_p",
        "operation": {"type": "create_file", "path": "p.txt", "diff": "+" + "x" * (20 * MiB)},
    }
    r = http.post(f"/v1/containers/{c.id}/calls", json=patch)
    assert r.status_code == 200 and r.json()["status"] == "failed", r.text
    assert "Disk quota exceeded" in r.json()["output"], r.text
    ls = shell(http, c.id, "ls -A")  # nothing half-written is left
    assert ls["output"][0]["stdout"] == "a\n", ls

    shell(http, c.id, "rm a")
    r = http.post(f"/v1/containers/{c.id}/files", files={"file": ("up.bin", b"\0" * (20 * MiB))})
    assert r.status_code == 200, r.text
