"""How many containers a server runs: every bound on the way is sized from the configured
limits, so creating past them answers 429, never a 500 from something that ran out (the
tmpfs standing in for the cgroup2 mount on hybrid hosts held ~64 containers)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import error_of

PROJECTS = 3
PER_PROJECT = 100  # limits.max_containers_per_project, the default
EXTRA = 5  # creates past each project's cap


def _create(base_url: str, key: str) -> Callable[[httpx.AsyncClient], Any]:
    async def create(http: httpx.AsyncClient) -> httpx.Response:
        return await http.post(
            f"{base_url}/containers",
            json={"name": "load", "memory_limit": "1g"},
            headers={"authorization": f"Bearer {key}"},
        )

    return create


@pytest.mark.slow
def test_300_running_containers_every_reply_200_or_429(
    server_factory: Callable[..., Any],
) -> None:
    server = server_factory(env={"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0"}, start=False)
    keys = [server.create_key(f"load{i}") for i in range(PROJECTS)]
    server.start()
    assert server.proc is not None
    statuses: Counter[int] = Counter()
    created: list[tuple[str, str]] = []  # (key, container id)
    bodies: list[str] = []

    async def main() -> None:
        limits = httpx.Limits(max_connections=16)
        # A reply's bound, not its expected time: under load a create can take a minute.
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            gate = asyncio.Semaphore(6)

            async def one(key: str) -> None:
                async with gate:
                    r = await _create(server.base_url, key)(http)
                statuses[r.status_code] += 1
                if r.status_code == 200:
                    created.append((key, r.json()["id"]))
                else:
                    bodies.append(r.text)
                    assert r.status_code == 429, r.text
                    assert error_of(r)["code"] == "quota_exceeded"

            await asyncio.gather(
                *(one(key) for key in keys for _ in range(PER_PROJECT + EXTRA)),
                return_exceptions=False,
            )
            assert statuses == {200: PROJECTS * PER_PROJECT, 429: PROJECTS * EXTRA}, bodies[:3]

            # All of them really run: each answers a command through its agent, at once.
            async def call(key: str, cid: str) -> None:
                async with gate:
                    r = await http.post(
                        f"{server.base_url}/containers/{cid}/calls",
                        json={
                            "type": "shell_call",
                            "call_id": "c",
                            "action": {"commands": ["echo $((6*7))"]},
                        },
                        headers={"authorization": f"Bearer {key}"},
                    )
                assert r.status_code == 200, r.text
                assert r.json()["output"][0]["stdout"] == "42\n"

            await asyncio.gather(*(call(key, cid) for key, cid in created))
            # The server holds no descriptor per idle container.
            assert server.proc is not None
            assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < 200

            async def delete(key: str, cid: str) -> None:
                async with gate:
                    r = await http.delete(
                        f"{server.base_url}/containers/{cid}",
                        headers={"authorization": f"Bearer {key}"},
                    )
                assert r.status_code == 200, r.text

            await asyncio.gather(*(delete(key, cid) for key, cid in created))

    asyncio.run(main())
    assert "Traceback" not in server.log()


def test_a_full_host_answers_429_to_retry_later(
    server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """The host-wide container limit (runtime.uid_range_count) answers 429 with a message
    naming it, and the capacity comes back as containers end."""
    server = server_factory(
        env={
            "SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0",
            # A pool of two of its own, below the default one, so no other server shares it.
            "SHELLBOX_RUNTIME__UID_RANGE_FIRST": str(0x6FF0_0000),
            "SHELLBOX_RUNTIME__UID_RANGE_COUNT": "2",
            "SHELLBOX_RUNTIME__UID_CLAIMS_DIR": str(tmp_path / "claims"),
        },
    )
    auth = {"authorization": "Bearer any"}  # no keys: open mode on loopback
    with httpx.Client(base_url=server.base_url, timeout=60, headers=auth) as http:
        ids = []
        for _ in range(2):
            r = http.post("/containers", json={"name": "full"})
            assert r.status_code == 200, r.text
            ids.append(r.json()["id"])
        r = http.post("/containers", json={"name": "full"})
        assert r.status_code == 429, r.text
        assert error_of(r)["code"] == "capacity_exceeded"
        assert "runtime.uid_range_count" in error_of(r)["message"]
        assert r.headers["x-should-retry"] == "true"
        assert http.delete(f"/containers/{ids[0]}").status_code == 200
        r = http.post("/containers", json={"name": "full"})
        assert r.status_code == 200, r.text
