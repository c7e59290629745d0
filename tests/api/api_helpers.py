"""Helpers for the HTTP API tests (imported as ``api_helpers``; tests/ is not a package)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx


def shell(http: httpx.Client, cid: str, *commands: str, **action: Any) -> dict[str, Any]:
    """Run a ``shell_call`` and return its ``shell_call_output`` item (asserting a 200)."""
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={
            "type": "shell_call",
            "call_id": "call_t",
            "action": {"commands": commands, **action},
        },
    )
    assert r.status_code == 200, r.text
    item: dict[str, Any] = r.json()
    return item


def local_shell(http: httpx.Client, cid: str, argv: list[str], **action: Any) -> dict[str, Any]:
    r = http.post(
        f"/v1/containers/{cid}/calls",
        json={
            "type": "local_shell_call",
            "call_id": "call_l",
            "action": {"type": "exec", "command": argv, "env": {}, **action},
        },
    )
    assert r.status_code == 200, r.text
    item: dict[str, Any] = r.json()
    return item


def host_pids(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (the host sees sandbox processes)."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


# The bound of a wait for something the server, an agent or the kernel does at its own pace
# (a process to start or die, a container to go to sleep): a wait ends as soon as its
# condition holds, so the bound costs nothing when all is well; it only has to outlast a
# loaded host (load average 100-400), where 5-10 s bounds failed.
WAIT_S = 60


def wait_until(predicate: Callable[[], bool], timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def error_of(r: httpx.Response) -> dict[str, Any]:
    """The OpenAI error envelope's inner object, checking its shape on the way."""
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    return err
