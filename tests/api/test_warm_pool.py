"""The warm pool: containers started ahead of time are handed out as fresh ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
from api_helpers import shell, wait_until


def _sandboxes(state_dir: Path) -> set[str]:
    return {p.name for p in (state_dir / "containers").iterdir() if (p / "spec.json").exists()}


def test_pooled_containers_are_fresh_and_used_only_for_default_specs(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "2"})
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    http = httpx.Client(base_url=srv.root_url, headers={"authorization": "Bearer k"}, timeout=60)
    assert wait_until(lambda: len(_sandboxes(srv.state_dir)) == 2, 30)
    pooled = _sandboxes(srv.state_dir)
    assert list(sdk.containers.list()) == []  # pooled containers belong to nobody yet

    c = sdk.containers.create(name="from-pool")
    assert c.id in pooled
    assert c.status == "running" and c.memory_limit == "1g"
    out = shell(
        http, c.id, "ls -A /mnt/data | wc -l", "id -u", "cat /proc/1/cmdline | tr '\\0' ' '"
    )
    assert [o["stdout"] for o in out["output"][:2]] == ["0\n", "1000\n"]
    assert "agent" in out["output"][2]["stdout"]
    assert list(sdk.containers.files.list(c.id)) == []

    # A container that asks for more than the default spec is built for it.
    assert wait_until(lambda: len(_sandboxes(srv.state_dir) - {c.id}) == 2, 30)
    before = _sandboxes(srv.state_dir)
    big = sdk.containers.create(name="big", memory_limit="4g")
    assert big.id not in before
    mem = shell(
        http,
        big.id,
        "cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    )
    assert int(mem["output"][0]["stdout"]) == 4 << 30

    # After a restart, pooled containers left behind are destroyed and the pool is refilled.
    srv.stop()
    again = server_factory(state_dir=srv.state_dir, env={"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "2"})
    assert wait_until(lambda: len(_sandboxes(srv.state_dir) - {c.id, big.id}) == 2, 30)
    assert not (_sandboxes(srv.state_dir) & (before - {c.id, big.id}))
    sdk2 = openai.OpenAI(base_url=again.base_url, api_key="k", max_retries=0)
    assert {x.id for x in sdk2.containers.list()} == {c.id, big.id}
    http.close()
    again.stop()


def test_pool_off(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0"})
    sdk = openai.OpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
    c = sdk.containers.create(name="cold")
    assert _sandboxes(srv.state_dir) == {c.id}
    srv.stop()
