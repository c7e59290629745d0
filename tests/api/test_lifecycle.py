"""Sleep, wake, expiry (with short settings) and a restart after the server was killed."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from api_helpers import WAIT_S, error_of, host_pids, shell, wait_until

# Containers sleep after 1 s idle, the reaper looks every 0.2 s, and one expires_after minute
# lasts 3 s (lifecycle.minute_s), so `minutes=1` expires within seconds.
SHORT = {
    "SHELLBOX_LIFECYCLE__IDLE_SLEEP_S": "1",
    "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.2",
    "SHELLBOX_LIFECYCLE__MINUTE_S": "3",
}


@pytest.fixture(scope="module")
def short(server_factory: Any) -> Any:
    return server_factory(env=SHORT)


def _clients(srv: Any, key: str = "k") -> tuple[Any, httpx.Client]:
    sdk = openai.OpenAI(base_url=srv.base_url, api_key=key, max_retries=0)
    http = httpx.Client(
        base_url=srv.root_url, headers={"authorization": f"Bearer {key}"}, timeout=60
    )
    return sdk, http


def test_idle_container_sleeps_and_a_call_wakes_it(short: Any) -> None:
    sdk, http = _clients(short)
    marker = f"bg-{secrets.token_hex(5)}"
    c = sdk.containers.create(name="sleepy")
    shell(http, c.id, f"echo kept > kept.txt; (exec -a {marker} sleep 1000) &")
    assert host_pids(marker)
    assert wait_until(lambda: sdk.containers.retrieve(c.id).status == "sleeping", WAIT_S)
    # Asleep: its processes are frozen with their memory (tests/api/test_pause.py: they use
    # no CPU and answer after the next call), its disk is kept and still listed.
    assert host_pids(marker)
    assert [f.path for f in sdk.containers.files.list(c.id)] == ["/mnt/data/kept.txt"]
    before = sdk.containers.retrieve(c.id).last_active_at
    time.sleep(1.1)
    item = shell(http, c.id, "cat kept.txt")
    assert item["output"][0]["stdout"] == "kept\n"
    woke = sdk.containers.retrieve(c.id)
    assert woke.status == "running"
    assert woke.last_active_at > before
    # Streamed calls wake it too.
    assert wait_until(lambda: sdk.containers.retrieve(c.id).status == "sleeping", WAIT_S)
    with http.stream(
        "POST",
        f"/v1/containers/{c.id}/calls?stream=true",
        json={"type": "shell_call", "call_id": "s", "action": {"commands": ["cat kept.txt"]}},
    ) as r:
        assert r.status_code == 200
        assert '"kept\\n"' in r.read().decode()
    sdk.containers.delete(c.id)


def test_idle_sleep_stop_ends_the_processes(server_factory: Any) -> None:
    srv = server_factory(env={**SHORT, "SHELLBOX_LIFECYCLE__IDLE_SLEEP": "stop"})
    sdk, http = _clients(srv)
    marker = f"bg-{secrets.token_hex(5)}"
    c = sdk.containers.create(name="stopped")
    shell(http, c.id, f"echo kept > kept.txt; (exec -a {marker} sleep 1000) &")
    assert host_pids(marker)
    assert wait_until(lambda: sdk.containers.retrieve(c.id).status == "sleeping", WAIT_S)
    assert not host_pids(marker)  # ended: their memory is freed
    assert shell(http, c.id, "cat kept.txt")["output"][0]["stdout"] == "kept\n"
    assert sdk.containers.retrieve(c.id).status == "running"
    sdk.containers.delete(c.id)
    http.close()


def test_activity_keeps_a_container_awake(short: Any) -> None:
    sdk, http = _clients(short)
    c = sdk.containers.create(name="busy")
    # A call that runs longer than the idle time is not put to sleep under it.
    item = shell(http, c.id, "sleep 2; echo done")
    assert item["output"][0]["stdout"] == "done\n"
    assert sdk.containers.retrieve(c.id).status == "running"
    sdk.containers.delete(c.id)


def test_container_expires(short: Any) -> None:
    sdk, http = _clients(short)
    c = sdk.containers.create(
        name="brief", expires_after={"anchor": "last_active_at", "minutes": 1}
    )
    cf = sdk.containers.files.create(c.id, file=("a.txt", b"a"))
    data_dir = short.view(short.data_dir(c.id))
    assert (data_dir / "a.txt").exists()
    assert wait_until(lambda: sdk.containers.retrieve(c.id).status == "expired", WAIT_S)
    # Processes and files are gone; it no longer counts, runs nothing, takes no files.
    assert not data_dir.exists()
    r = http.post(
        f"/v1/containers/{c.id}/calls",
        json={"type": "shell_call", "call_id": "x", "action": {"commands": ["true"]}},
    )
    assert r.status_code == 409
    assert r.headers["x-should-retry"] == "false"
    err = error_of(r)
    assert "expired" in err["message"] and "create a new" in err["message"]
    with pytest.raises(openai.ConflictError):
        sdk.containers.files.create(c.id, file=("b.txt", b"b"))
    f = sdk.files.create(file=("f.txt", b"f"), purpose="user_data")
    r = http.post(f"/v1/containers/{c.id}/files", json={"file_id": f.id})
    assert r.status_code == 409
    with pytest.raises(openai.NotFoundError):
        sdk.containers.files.content.retrieve(cf.id, container_id=c.id)
    assert list(sdk.containers.files.list(c.id)) == []
    assert sdk.containers.retrieve(c.id).status == "expired"
    assert c.id in {x.id for x in sdk.containers.list()}
    sdk.containers.delete(c.id)
    with pytest.raises(openai.NotFoundError):
        sdk.containers.retrieve(c.id)


def test_restart_after_kill_loses_nothing(server_factory: Any) -> None:
    first = server_factory(start=False)
    key = first.create_key("durable")
    first.start()
    sdk, http = _clients(first, key)
    bg = f"svc-{secrets.token_hex(5)}"
    busy = f"busy-{secrets.token_hex(5)}"
    c = sdk.containers.create(name="survivor", memory_limit="4g")
    idle = sdk.containers.create(name="idle")
    sdk.containers.files.create(c.id, file=("up.txt", b"uploaded"))
    f = sdk.files.create(file=("blob.txt", b"blob"), purpose="user_data")
    shell(http, c.id, f"echo made > made.txt; (exec -a {bg} sleep 1000) &")
    files_before = {x.id: x.path for x in sdk.containers.files.list(c.id)}

    # Kill -9 in the middle of a call.
    def long_call() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server dies under it
            http.post(
                f"/v1/containers/{c.id}/calls",
                json={
                    "type": "shell_call",
                    "call_id": "long",
                    "action": {"commands": [f"exec -a {busy} sleep 60"]},
                },
            )

    t = threading.Thread(target=long_call)
    t.start()
    assert wait_until(lambda: bool(host_pids(busy)), WAIT_S)
    first.kill()
    t.join(10)

    second = server_factory(state_dir=first.state_dir)
    sdk2, http2 = _clients(second, key)
    assert {x.id for x in sdk2.containers.list()} == {c.id, idle.id}
    got = sdk2.containers.retrieve(c.id)
    assert (got.status, got.memory_limit, got.name) == ("running", "4g", "survivor")
    assert {x.id: x.path for x in sdk2.containers.files.list(c.id)} == files_before
    assert sdk2.files.content(f.id).read() == b"blob"
    # The container kept running through the restart: its service is alive, and it runs
    # commands; the call cut off by the crash did not leave its command behind.
    assert host_pids(bg)
    assert wait_until(lambda: not host_pids(busy), WAIT_S)
    item = shell(http2, c.id, "cat up.txt made.txt")
    assert item["output"][0]["stdout"] == "uploadedmade\n"
    assert shell(http2, idle.id, "echo ok")["output"][0]["stdout"] == "ok\n"
    # Keys survive too: an unknown token is still refused.
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=second.base_url, api_key="nope", max_retries=0).containers.list()
    sdk2.containers.delete(c.id)
    sdk2.containers.delete(idle.id)
    assert not host_pids(bg)
    second.stop()


def test_deleting_a_container_under_a_running_call(client: Any, http: httpx.Client) -> None:
    c = client.containers.create(name="doomed")
    marker = f"doomed-{secrets.token_hex(5)}"
    result: dict[str, Any] = {}

    def call() -> None:
        r = http.post(
            f"/v1/containers/{c.id}/calls",
            json={
                "type": "shell_call",
                "call_id": "x",
                "action": {"commands": [f"exec -a {marker} sleep 60"]},
            },
        )
        result["status"], result["body"] = r.status_code, r.json()

    t = threading.Thread(target=call)
    t.start()
    assert wait_until(lambda: bool(host_pids(marker)), WAIT_S)
    client.containers.delete(c.id)
    t.join(20)
    assert not t.is_alive()
    assert result["status"] == 409, result
    assert "deleted" in result["body"]["error"]["message"]
    assert not host_pids(marker)
