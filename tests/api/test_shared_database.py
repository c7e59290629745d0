"""Two servers on one PostgreSQL database (the several-replicas set-up): no row cached by one
outlives a change made elsewhere. (The per-project cap across servers is held by one
transaction per create: tests/store/test_store_concurrency.py races it deterministically.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from api_helpers import error_of, shell

from shellbox.store import create_database
from shellbox.store.containers import SqlContainerStore


def _two_servers(server_factory: Callable[..., Any], pg_cluster: Any, **env: str) -> list[Any]:
    shared = {
        "SHELLBOX_STORE__DATABASE_URL": pg_cluster.new_database(),
        "SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0",
        **env,
    }
    a = server_factory(env=dict(shared), start=False)
    a.env["SHELLBOX_TEST_KEY"] = a.create_key("shared")
    b = server_factory(env=dict(shared), start=False)
    return [a.start(), b.start()]


def test_a_container_ended_by_another_server_is_gone_at_once(
    server_factory: Callable[..., Any], pg_cluster: Any
) -> None:
    """Server A has used a container (and holds it as live in memory); another server marks
    it deleted in the database. A's very next call answers 404, not a run in a container
    the database says is gone. (The other server is this test, writing through the store:
    two servers on one host cannot yet destroy each other's sandboxes.)"""
    a, b = _two_servers(server_factory, pg_cluster)
    auth = {"authorization": f"Bearer {a.env['SHELLBOX_TEST_KEY']}"}
    with (
        httpx.Client(base_url=a.root_url, timeout=120, headers=auth) as on_a,
        httpx.Client(base_url=b.root_url, timeout=120, headers=auth) as on_b,
    ):
        r = on_a.post("/v1/containers", json={"name": "shared"})
        assert r.status_code == 200, r.text
        cid = r.json()["id"]
        out = shell(on_a, cid, "echo hi")  # server A now holds it as live
        assert out["output"][0]["stdout"] == "hi\n"
        assert on_b.get(f"/v1/containers/{cid}").json()["status"] == "running"
        db = create_database(a.env["SHELLBOX_STORE__DATABASE_URL"])
        try:
            SqlContainerStore(db).set_status(cid, "deleted", deleted=True)
        finally:
            db.dispose()
        r = on_a.post(
            f"/v1/containers/{cid}/calls",
            json={"type": "shell_call", "call_id": "c", "action": {"commands": ["echo again"]}},
        )
        assert r.status_code == 404, r.text
        assert error_of(r)["code"] == "container_not_found"
        assert on_a.get(f"/v1/containers/{cid}").status_code == 404
        assert on_b.get(f"/v1/containers/{cid}").status_code == 404
