"""One container's life through a real server, touching every cgroup feature the sandbox uses:
create, a call, a timeout that kills a whole process tree (setsid and double-fork escapers),
the memory limit's OOM kill with its note, the pids limit, sleep and wake, delete (nothing of it
left on the host). It runs on this host (hybrid here) and in the pure cgroup v2 guest of
``scripts/test-v2.sh``; ``/healthz`` must name the layout the server detected.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from api_helpers import WAIT_S, host_pids, shell, wait_until

from shellbox.agent.protocol import OOM_NOTE
from shellbox.sandbox.cgroups import detect_mode

# Containers sleep after 1 s idle; the reaper looks every 0.2 s; 200 processes per container
# (the commands get 16 fewer: the agent's reserve).
SHORT = {
    "SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "1",
    "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
    "SHELLBOX_RUNTIME__PIDS_LIMIT": "200",
}
FORK_ALL = """python3 -c '
import os, signal, time
kids = []
try:
    while len(kids) < 5000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    print(len(kids), e.errno)
for k in kids:
    os.kill(k, signal.SIGKILL)
    os.waitpid(k, 0)
'"""


@pytest.fixture(scope="module")
def short(server_factory: Any) -> Any:
    # Started with time to spare: under emulation (the cgroup v2 lane) imports alone take tens
    # of seconds.
    return server_factory(env=SHORT, start=False).start(timeout_s=300)


def _cgroup_dirs(cid: str) -> list[Path]:
    root = Path("/sys/fs/cgroup")
    return [*root.glob(f"shellbox/{cid}"), *root.glob(f"*/shellbox/{cid}")]


def _frozen(cid: str) -> bool:
    """Whether the container's cgroup is frozen (v2's cgroup.events, or v1's freezer)."""
    for d in _cgroup_dirs(cid):
        events = d / "cgroup.events"
        if events.exists() and "frozen 1" in events.read_text():
            return True
        state = d / "freezer.state"
        if state.exists() and state.read_text().strip() == "FROZEN":
            return True
    return False


def test_a_container_life_through_every_cgroup_feature(short: Any) -> None:
    health = httpx.get(f"{short.root_url}/healthz").json()
    assert health["cgroup"] == detect_mode().value
    assert "cgroup layout: " in short.log()  # and the start-up log says it in words
    expected = os.environ.get("SHELLBOX_EXPECT_CGROUP")
    if expected:
        assert health["cgroup"] == expected
    sdk = openai.OpenAI(base_url=short.base_url, api_key="k", max_retries=0)
    http = httpx.Client(base_url=short.root_url, headers={"authorization": "Bearer k"}, timeout=180)
    c = sdk.containers.create(name="cgroups", memory_limit="1g")
    assert _cgroup_dirs(c.id)

    # A call, while something else keeps running: the agent keeps taking calls.
    item = shell(http, c.id, "echo hi; id -u", timeout_ms=30_000)
    assert item["output"][0]["stdout"] == "hi\n1000\n"

    # A timeout kills the command's whole tree, escapers included.
    # The timeout must fall after the escapers started ("started"), however slow the host (the
    # emulated guest, a loaded one): 3 s first, doubled until a run gets that far.
    marker = f"9{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    timeout_ms = 3000
    while True:
        item = shell(
            http, c.id, f"setsid sleep {marker} & (sleep {marker} &); echo started; sleep 600",
            timeout_ms=timeout_ms,
        )  # fmt: skip
        out = item["output"][0]
        assert out["outcome"] == {"type": "timeout"}
        if out["stdout"] or timeout_ms > WAIT_S * 1000:
            break
        timeout_ms *= 2
    assert out["stdout"] == "started\n"
    assert wait_until(lambda: not host_pids(f"sleep {marker}"), WAIT_S), host_pids(marker)

    # The memory limit kills the command that overran it, says so, and spares the agent.
    alloc = "python3 -c 'b = bytearray(2048 * 1024 * 1024); print(len(b))'"
    item = shell(http, c.id, "echo before >&2; " + alloc, "echo alive", timeout_ms=120_000)
    oom, alive = item["output"]
    assert oom["outcome"] == {"type": "exit", "exit_code": 137}
    assert oom["stderr"].splitlines()[0] == "before"
    assert oom["stderr"].splitlines()[-1] == OOM_NOTE.format(limit="1024 MiB")
    assert alive["stdout"] == "alive\n"

    # The pids limit: a command cannot start more processes than the container may hold.
    item = shell(http, c.id, FORK_ALL, timeout_ms=120_000)
    started, errno = (int(x) for x in item["output"][0]["stdout"].split())
    assert (errno, 150 < started < 200 - 16) == (11, True), item  # EAGAIN at the cmds' pids.max

    # Sleep (its processes frozen, its files kept) and wake (the next call).
    bg = f"8{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    shell(http, c.id, f"echo kept > kept.txt; (sleep {bg} &)", timeout_ms=30_000)
    assert host_pids(f"sleep {bg}")
    assert wait_until(lambda: sdk.containers.retrieve(c.id).status == "sleeping", 30)
    assert _frozen(c.id)
    item = shell(http, c.id, "cat kept.txt", timeout_ms=60_000)
    assert item["output"][0]["stdout"] == "kept\n"
    assert sdk.containers.retrieve(c.id).status == "running"

    # Delete: nothing of it is left on the host.
    shell(http, c.id, f"(sleep {bg} &)", timeout_ms=30_000)
    sdk.containers.delete(c.id)
    with pytest.raises(openai.NotFoundError):
        sdk.containers.retrieve(c.id)
    deadline = time.monotonic() + WAIT_S
    while (_cgroup_dirs(c.id) or host_pids(f"sleep {bg}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _cgroup_dirs(c.id) == [] and host_pids(f"sleep {bg}") == []
