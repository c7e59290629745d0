"""Memory and concurrency under large calls: the server's budget for request bodies, and the
agent's bounded buffers and per-container cap on concurrent calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from api_helpers import error_of, shell

MIB = 1 << 20
AUTH = {"authorization": "Bearer sk-test"}  # a server without keys takes any bearer token
# Peak resident memory of the server while 8 calls of 100 x 1 MiB commands run at once,
# above what it held before: about 2 x the body budget (256 MiB by default: a body being
# parsed and its parsed form), plus the allocator's slack. On main it was ~2.7 GB.
SERVER_PEAK_GROWTH_MB = 700
# The agent's own peak while those calls run (its memory reserve is 48 MiB).
AGENT_PEAK_MB = 40


def call_body(commands: list[bytes]) -> bytes:
    """A shell_call body built from already-escaped commands, without a 100 MiB str copy."""
    quoted = b",".join(b'"' + c + b'"' for c in commands)
    return b'{"type":"shell_call","call_id":"c","action":{"commands":[' + quoted + b"]}}"


def padded(i: int) -> bytes:
    """Command ``i``, exactly 1 MiB: it prints ``i`` and exits before bash reads the comment
    that fills the rest (parsing 1 MiB of it would cost bash ~90 ms a command)."""
    head = f"echo {i}; exit\\n#".encode()  # JSON-escaped newline
    return head + b"x" * (MIB - len(head) + 1)


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def agent_pid(cid: str) -> int:
    """The container's PID 1, found from its memory cgroup (v1) on the host."""
    from shellbox.sandbox.cgroups import CgroupMode, detect_mode

    if detect_mode() is CgroupMode.v2:
        procs = f"/sys/fs/cgroup/shellbox/{cid}/agent/cgroup.procs"
    else:
        procs = f"/sys/fs/cgroup/memory/shellbox/{cid}/cgroup.procs"
    with open(procs) as f:
        for pid in f.read().split():
            with open(f"/proc/{pid}/status") as st:
                nspid = next(line for line in st if line.startswith("NSpid:")).split()
            if nspid[-1] == "1":
                return int(pid)
    raise LookupError(cid)


def post_all(url: str, headers: dict[str, str], bodies: list[bytes]) -> list[httpx.Response]:
    """POST the bodies at once, one thread each, released together."""
    gate = threading.Barrier(len(bodies))

    def post(body: bytes) -> httpx.Response:
        with httpx.Client(timeout=600, headers=headers) as c:
            gate.wait()
            return c.post(url, content=body, headers={"content-type": "application/json"})

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, bodies))


def test_eight_calls_of_100_commands_of_1_mib_at_once_succeed_in_bounded_memory(
    server_factory: Callable[..., Any],
) -> None:
    # Calls past the budget queue; on a loaded machine the last ones could wait longer than
    # the default minute and answer 429 (a right answer too): here they all wait their turn.
    srv = server_factory(env={"SHELLBOX_LIMITS__BODY_BUDGET_WAIT_S": "600"})
    assert srv.proc is not None
    with httpx.Client(base_url=srv.root_url, timeout=120, headers=AUTH) as http:
        cid = http.post("/v1/containers", json={"name": "big", "memory_limit": "1g"}).json()["id"]
        shell(http, cid, "true")  # the server's steady state, after one call
    before_kb = status_kb(srv.proc.pid, "VmRSS")
    body = call_body([padded(i) for i in range(100)])
    t = time.monotonic()
    answers = post_all(f"{srv.root_url}/v1/containers/{cid}/calls", AUTH, [body] * 8)
    elapsed = time.monotonic() - t
    del body
    for r in answers:
        assert r.status_code == 200, r.text[:500]
        out = r.json()["output"]
        assert [o["stdout"] for o in out] == [f"{i}\n" for i in range(100)]
        assert {o["outcome"]["exit_code"] for o in out} == {0}
    growth_mb = (status_kb(srv.proc.pid, "VmHWM") - before_kb) // 1024
    agent_mb = status_kb(agent_pid(cid), "VmHWM") // 1024
    print(f"8 x 100 x 1 MiB in {elapsed:.1f} s; server peak +{growth_mb} MB, agent {agent_mb} MB")
    assert growth_mb < SERVER_PEAK_GROWTH_MB, growth_mb
    assert agent_mb < AGENT_PEAK_MB, agent_mb
    # And the memory goes back: the parsed commands are freed, and so are the blocks.
    assert (status_kb(srv.proc.pid, "VmRSS") - before_kb) // 1024 < 64


def test_a_container_takes_8_calls_at_once_and_answers_429_to_a_ninth(
    http: httpx.Client, cid: str
) -> None:
    url = f"{http.base_url}/v1/containers/{cid}/calls"
    body = call_body([b"sleep 2; echo done"])
    answers = post_all(url, dict(http.headers), [body] * 9)
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] * 8 + [429], codes
    [busy] = [r for r in answers if r.status_code == 429]
    err = error_of(busy)
    assert err["code"] == "container_busy"
    assert err["type"] == "rate_limit_error"
    assert "already runs 8 calls at once" in err["message"]
    assert busy.headers["x-should-retry"] == "true"
    for r in answers:
        if r.status_code == 200:
            assert r.json()["output"][0]["stdout"] == "done\n"
    assert shell(http, cid, "echo again")["output"][0]["stdout"] == "again\n"


def test_past_the_body_budget_a_call_waits_then_gets_429_and_small_ones_never_wait(
    server_factory: Callable[..., Any],
) -> None:
    srv = server_factory(
        env={
            "SHELLBOX_LIMITS__BODY_BUDGET_BYTES": str(4 * MIB),
            "SHELLBOX_LIMITS__BODY_BUDGET_WAIT_S": "1",
        }
    )
    with httpx.Client(base_url=srv.root_url, timeout=120, headers=AUTH) as http:
        cid = http.post("/v1/containers", json={"name": "budget"}).json()["id"]
        url = f"/v1/containers/{cid}/calls"
        pad = b"true #" + b"x" * (MIB - 10)
        big = call_body([b"sleep 4; echo held", pad, pad, pad])  # holds 3 MiB for 4 s
        other = call_body([b"echo second", pad, pad])  # needs 2 MiB: no room
        results: dict[str, Any] = {}

        def hold() -> None:
            results["big"] = http.post(url, content=big)

        holder = threading.Thread(target=hold)
        holder.start()
        time.sleep(1)  # the big call is running now
        t = time.monotonic()
        r = http.post(url, content=other)
        waited = time.monotonic() - t
        assert r.status_code == 429, r.text
        err = error_of(r)
        assert err["code"] == "server_busy"
        assert "limits.body_budget_bytes" in err["message"]
        assert r.headers["retry-after"] == "1"
        assert 0.9 < waited < 3, waited
        t = time.monotonic()
        assert shell(http, cid, "echo small")["output"][0]["stdout"] == "small\n"
        assert time.monotonic() - t < 1.5  # a small body is not queued behind the big one
        holder.join()
        assert results["big"].status_code == 200
        assert results["big"].json()["output"][0]["stdout"] == "held\n"
        # Room again: the same call now goes through.
        r = http.post(url, content=other)
        assert r.status_code == 200, r.text
        assert r.json()["output"][0]["stdout"] == "second\n"
