"""A container whose sandbox died under the server (its PID 1, the agent, was killed from the
host: an operator's kill, the host OOM killer) is started again from its disk on the next
call, instead of failing every call until the server restarts."""

from __future__ import annotations

import os
import secrets
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from api_helpers import WAIT_S, host_pids, shell, wait_until


def container_init_pid(pid: int) -> int:
    """The host pid of the PID 1 of the pid namespace that ``pid`` (a host pid) lives in."""
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields["NSpid"].split()[-1] == "1":
            return pid
        pid = int(fields["PPid"])


def exited(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def kill_sandbox(http: httpx.Client, cid: str) -> None:
    """Kill the container's PID 1 from the host; a background process dies with it. Returns
    once the sandbox is dead: a namespace's init exits only after every process in it has
    (a background process, the agent's spare fork, which may still hold the agent's listening
    socket), so the next call finds nothing of it left."""
    marker = f"sleep {900_000 + secrets.randbelow(99_999)}"
    shell(http, cid, f"({marker} &)")
    assert wait_until(lambda: len(host_pids(marker)) == 1, WAIT_S)
    init = container_init_pid(host_pids(marker)[0])
    os.kill(init, signal.SIGKILL)
    assert wait_until(lambda: exited(init), WAIT_S)
    assert not host_pids(marker)


def test_a_killed_sandbox_is_restarted_with_its_files(http: httpx.Client, cid: str) -> None:
    shell(http, cid, "echo kept > kept.txt")
    kill_sandbox(http, cid)
    [out] = shell(http, cid, "cat kept.txt")["output"]
    assert out["stdout"] == "kept\n" and out["outcome"] == {"type": "exit", "exit_code": 0}
    assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"

    kill_sandbox(http, cid)  # the streamed form starts it again too
    body = {"type": "shell_call", "action": {"commands": ["cat kept.txt"]}}
    with http.stream("POST", f"/v1/containers/{cid}/calls?stream=true", json=body) as r:
        assert r.status_code == 200
        text = r.read().decode()
    assert "response.output_item.done" in text and "kept" in text, text


def test_a_call_whose_sandbox_dies_under_it_fails_and_is_not_run_again(
    http: httpx.Client, cid: str
) -> None:
    marker = f"sleep {800_000 + secrets.randbelow(99_999)}.5"
    body = {
        "type": "shell_call",
        "action": {"commands": [f"{marker}; echo once >> runs.txt"], "timeout_ms": 60_000},
    }
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(http.post, f"/v1/containers/{cid}/calls", json=body)
        assert wait_until(lambda: len(host_pids(marker)) >= 1, WAIT_S)  # bash, then its sleep
        init = container_init_pid(host_pids(marker)[0])
        os.kill(init, signal.SIGKILL)
        r = call.result()
        assert wait_until(lambda: exited(init), WAIT_S)  # the next call finds it dead
    assert r.status_code == 500, r.text
    assert r.json()["error"]["code"] == "agent_unavailable"
    # The next call starts the sandbox again; the lost command did not run a second time.
    [out] = shell(http, cid, "cat runs.txt 2>&1; echo done")["output"]
    assert out["stdout"].endswith("No such file or directory\ndone\n"), out
