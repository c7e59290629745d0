"""Pause with memory: a frozen container's processes keep their state and use no CPU; any
call thaws it, idle sleep freezes the same way, and a server restart keeps it frozen."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import WAIT_S, error_of, host_pids, shell, wait_until

COUNTER = """cat > /tmp/counter.py <<'PY'
import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        body = str(n).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", 8765), H).serve_forever()
PY
(exec -a {marker} python3 /tmp/counter.py >/dev/null 2>&1 &)"""
ASK = (
    'python3 -c "import time, urllib.request as u\n'
    "for _ in range(100):\n"
    "    try: print(u.urlopen('http://127.0.0.1:8765').read().decode()); break\n"
    '    except OSError: time.sleep(0.1)"'
)
AUTH = {"authorization": "Bearer k"}
SHORT = {
    "SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "1",
    "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
}


@pytest.fixture
def http(server: Any, api_key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.root_url, headers={"authorization": f"Bearer {api_key}"}, timeout=120
    ) as client:
        yield client


def _counter(http: httpx.Client) -> tuple[str, str]:
    """A container running a counter server in the background; (its id, the marker)."""
    cid = http.post("/v1/containers", json={"name": "counter"}).json()["id"]
    marker = f"counter-{secrets.token_hex(5)}"
    shell(http, cid, COUNTER.format(marker=marker))
    assert _ask(http, cid) == "1"
    return cid, marker


def _ask(http: httpx.Client, cid: str) -> str:
    out = shell(http, cid, ASK)["output"][0]
    return str(out["stdout"]).strip()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_pause_keeps_memory_uses_no_cpu_and_any_call_resumes(http: httpx.Client) -> None:
    cid, marker = _counter(http)
    spin = f"spin-{secrets.token_hex(5)}"
    shell(http, cid, f"(exec -a {spin} sh -c 'while :; do :; done' &)")
    assert wait_until(lambda: len(host_pids(spin)) == 1, WAIT_S)
    [spinner] = host_pids(spin)

    r = http.post(f"/v1/containers/{cid}/pause")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "paused"
    assert http.get(f"/v1/containers/{cid}").json()["status"] == "paused"
    before = _cpu_ticks(spinner)
    time.sleep(1.0)
    assert _cpu_ticks(spinner) == before  # frozen: not one tick in a second
    assert http.post(f"/v1/containers/{cid}/pause").json()["status"] == "paused"  # idempotent

    assert _ask(http, cid) == "2"  # a call thaws it; the server kept its count
    assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"
    assert _cpu_ticks(spinner) > before

    http.post(f"/v1/containers/{cid}/pause")
    r = http.post(f"/v1/containers/{cid}/resume")
    assert r.status_code == 200 and r.json()["status"] == "running", r.text
    assert _ask(http, cid) == "3"
    assert host_pids(marker)
    http.delete(f"/v1/containers/{cid}")
    r = http.post(f"/v1/containers/{cid}/pause")
    assert r.status_code == 404 and error_of(r)["code"] == "container_not_found"


def test_idle_sleep_freezes_and_the_next_call_finds_the_service(server_factory: Any) -> None:
    srv = server_factory(env=SHORT)
    with httpx.Client(base_url=srv.root_url, headers=AUTH, timeout=120) as http:
        cid, marker = _counter(http)
        assert wait_until(
            lambda: http.get(f"/v1/containers/{cid}").json()["status"] == "sleeping", 10
        )
        assert host_pids(marker)  # frozen, not ended
        assert _ask(http, cid) == "2"
        assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"


def test_a_server_restart_keeps_a_paused_container_paused(server_factory: Any) -> None:
    first = server_factory()
    with httpx.Client(base_url=first.root_url, headers=AUTH, timeout=120) as http:
        cid, marker = _counter(http)
        assert http.post(f"/v1/containers/{cid}/pause").json()["status"] == "paused"
    first.kill()
    second = server_factory(state_dir=first.state_dir)
    with httpx.Client(base_url=second.root_url, headers=AUTH, timeout=120) as http:
        assert http.get(f"/v1/containers/{cid}").json()["status"] == "paused"
        assert _ask(http, cid) == "2"
        assert host_pids(marker)


def _freeze_cgroup(cid: str) -> None:
    """Freeze a container behind the server's back, as a snapshot does for an instant."""
    root = Path("/sys/fs/cgroup")
    v2 = root / "shellbox" / cid / "cgroup.freeze"
    if v2.exists():
        v2.write_text("1")
    else:
        (root / "freezer" / "shellbox" / cid / "freezer.state").write_text("FROZEN")


def test_a_container_frozen_when_the_server_died_is_thawed_with_its_state(
    server_factory: Any,
) -> None:
    """A server killed while a snapshot held the container frozen: the next server thaws it
    (it is ``running`` in the database) rather than restarting it and losing its processes."""
    first = server_factory()
    with httpx.Client(base_url=first.root_url, headers=AUTH, timeout=120) as http:
        cid, marker = _counter(http)
    _freeze_cgroup(cid)
    first.kill()
    second = server_factory(state_dir=first.state_dir)
    with httpx.Client(base_url=second.root_url, headers=AUTH, timeout=120) as http:
        assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"
        assert _ask(http, cid) == "2"
        assert host_pids(marker)
