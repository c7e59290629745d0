"""Helpers for the HTTP API tests (imported as ``api_helpers``; tests/ is not a package)."""

from __future__ import annotations

import subprocess
from typing import Any

import httpx

from waiting import WAIT_S as WAIT_S
from waiting import wait_until as wait_until


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


def error_of(r: httpx.Response) -> dict[str, Any]:
    """The OpenAI error envelope's inner object, checking its shape on the way."""
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    return err
