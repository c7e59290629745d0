"""``shellbox run --snapshot``: a command-line fork of a snapshot the server took, on the
server's own state directory and store."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import httpx
from api_helpers import shell


def run(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shellbox.cli", "run", "--state-dir", str(srv.state_dir), *args],
        capture_output=True, text=True, env=srv.cli_env(), timeout=120,
    )  # fmt: skip


def test_run_starts_from_a_snapshot(server_factory: Any) -> None:
    srv = server_factory()
    with httpx.Client(base_url=srv.root_url, headers={"authorization": "Bearer k"}) as http:
        cid = http.post("/v1/containers", json={"name": "origin"}).json()["id"]
        shell(http, cid, "echo prepared > a.txt && mkdir -p ~/.local/bin && echo v1 > ~/.local/v")
        snap = http.post(f"/v1/containers/{cid}/snapshots").json()
        time.sleep(1.1)  # so that the fork's use shows as a later last_used_at

        p = run(srv, "--snapshot", snap["id"], "--", "cat a.txt ~/.local/v", "echo x > a.txt")
        assert p.returncode == 0, p.stderr
        out = json.loads(p.stdout)["output"]
        assert out[0]["stdout"] == "prepared\nv1\n"
        assert out[1]["outcome"] == {"type": "exit", "exit_code": 0}
        assert shell(http, cid, "cat a.txt")["output"][0]["stdout"] == "prepared\n"
        used = http.get(f"/v1/snapshots/{snap['id']}").json()["last_used_at"]
        assert used > snap["last_used_at"]  # a fork counts as use, from the CLI too

        p = run(srv, "--snapshot", snap["id"], "--keep", "--", "echo mine >> a.txt")
        assert p.returncode == 0, p.stderr
        fork = p.stdout.strip()
        p = run(srv, "--container", fork, "--", "cat a.txt")
        assert json.loads(p.stdout)["output"][0]["stdout"] == "prepared\nmine\n"
        subprocess.run(
            [sys.executable, "-c", DESTROY, str(srv.state_dir), fork],
            check=True, env=srv.cli_env(), timeout=60,
        )  # fmt: skip

        p = run(srv, "--snapshot", snap["id"], "--container", cid, "--", "true")
        assert p.returncode == 2 and "leave out --container" in p.stderr
        http.delete(f"/v1/snapshots/{snap['id']}")
        p = run(srv, "--snapshot", snap["id"], "--", "true")
        assert p.returncode == 2, p.stderr
        assert f"no snapshot '{snap['id']}'" in p.stderr


DESTROY = """
import asyncio, sys
from shellbox.sandbox import create_runtime
from shellbox.settings import Settings
asyncio.run(create_runtime(Settings(state_dir=sys.argv[1])).destroy(sys.argv[2]))
"""
