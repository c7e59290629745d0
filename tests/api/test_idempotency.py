"""``Idempotency-Key`` on creates: a retry gets the first result back and does nothing again,
also while the first request still runs and after a crash cut it off."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from typing import Any

import httpx
import openai
from api_helpers import WAIT_S, error_of, shell, wait_until


def key() -> dict[str, str]:
    return {"Idempotency-Key": str(uuid.uuid4())}


def post_dying(http: httpx.Client, url: str, out: list[httpx.Response], **kw: Any) -> None:
    """POST from a thread (to a server that may be killed under it)."""
    with contextlib.suppress(httpx.HTTPError):
        out.append(http.post(url, **kw))


def sse_data(text: str) -> list[dict[str, Any]]:
    return [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: ")]


def count_lines(http: httpx.Client, cid: str, path: str) -> str:
    return str(shell(http, cid, f"wc -l < {path}")["output"][0]["stdout"]).strip()


def test_creates_return_the_first_result(http: httpx.Client, client: Any, cid: str) -> None:
    name = f"idem-{uuid.uuid4().hex[:8]}"
    k = key()
    first = http.post("/v1/containers", json={"name": name}, headers=k)
    again = http.post("/v1/containers", json={"name": name}, headers=k)
    assert first.status_code == again.status_code == 200, again.text
    assert again.json() == first.json() and again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    assert [c.id for c in client.containers.list(name=name)] == [first.json()["id"]]
    # The same key with another body is refused, naming the header (Stripe: a 400).
    other = http.post("/v1/containers", json={"name": name + "x"}, headers=k)
    assert other.status_code == 400, other.text
    err = error_of(other)
    assert (err["code"], err["param"]) == ("idempotency_key_reused", "Idempotency-Key")
    client.containers.delete(first.json()["id"])

    # A call: the command runs once.
    item = {"type": "shell_call", "call_id": "c", "action": {"commands": ["echo x >> n.txt"]}}
    k = key()
    outs = [http.post(f"/v1/containers/{cid}/calls", json=item, headers=k) for _ in range(3)]
    assert all(o.status_code == 200 for o in outs)
    assert outs[1].json() == outs[0].json() == outs[2].json()
    assert count_lines(http, cid, "n.txt") == "1"
    # Files API and container files, through the SDK's own header option.
    kf = str(uuid.uuid4())
    files = [
        client.files.create(
            file=("a.txt", b"abc"), purpose="user_data", extra_headers={"Idempotency-Key": kf}
        )
        for _ in range(2)
    ]
    assert files[0].id == files[1].id
    kc = str(uuid.uuid4())
    cfiles = [
        client.containers.files.create(
            cid, file=("up.txt", b"abc"), extra_headers={"Idempotency-Key": kc}
        )
        for _ in range(2)
    ]
    assert cfiles[0].id == cfiles[1].id
    # A different file under the same key is another request.
    with_other = http.post(
        f"/v1/containers/{cid}/files",
        files={"file": ("up.txt", b"abd")},
        headers={"Idempotency-Key": kc},
    )
    assert (
        with_other.status_code == 400 and error_of(with_other)["code"] == "idempotency_key_reused"
    )
    # Without a key, every request runs.
    http.post(f"/v1/containers/{cid}/calls", json=item)
    assert count_lines(http, cid, "n.txt") == "2"


def test_bad_keys_are_400(http: httpx.Client) -> None:
    for bad in ("", "x" * 256, "a b", "caf\xe9".encode("latin-1")):
        r = http.post("/v1/containers", json={"name": "n"}, headers={"Idempotency-Key": bad})
        assert r.status_code == 400, (bad, r.text)
        assert error_of(r)["param"] == "Idempotency-Key"


def test_a_retry_while_the_first_runs_does_not_run_it_again(http: httpx.Client, cid: str) -> None:
    item = {
        "type": "shell_call",
        "call_id": "c",
        # Runs until the test lets it finish (not for a fixed time, which a loaded host can
        # use up before the retry arrives).
        "action": {
            "commands": ["echo x >> slow.txt; until [ -e /tmp/go ]; do sleep 0.05; done; echo done"]
        },
    }
    for url in (f"/v1/containers/{cid}/calls", f"/v1/containers/{cid}/calls?stream=true"):
        k = key()
        first: list[httpx.Response] = []
        t = threading.Thread(
            target=post_dying, args=(http, url, first), kwargs={"json": item, "headers": k}
        )
        t.start()
        assert wait_until(
            lambda: "slow.txt" in shell(http, cid, "ls")["output"][0]["stdout"], WAIT_S
        )
        busy = http.post(url, json=item, headers=k)
        assert busy.status_code == 409, busy.text
        assert error_of(busy)["code"] == "idempotency_key_in_use"
        assert busy.headers["x-should-retry"] == "true"
        shell(http, cid, "touch /tmp/go")
        t.join(WAIT_S)
        again = http.post(url, json=item, headers=k)
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
        if "stream" in url:
            # The replay is the final event, carrying the same output item.
            [replayed] = sse_data(again.text)
            final = sse_data(first[0].text)[-1]
            assert replayed["type"] == final["type"] == "response.output_item.done"
            assert replayed["item"] == final["item"]
        else:
            assert again.json() == first[0].json()
            assert first[0].json()["output"][0]["stdout"] == "done\n"
        assert count_lines(http, cid, "slow.txt") == "1"
        shell(http, cid, "rm slow.txt /tmp/go")


def test_expired_keys_run_again(server_factory: Any) -> None:
    srv = server_factory(env={"SHELLBOX_LIFECYCLE__IDEMPOTENCY_TTL_S": "1"})
    with httpx.Client(base_url=srv.root_url, headers={"authorization": "Bearer k"}) as h:
        k = key()
        first = h.post("/v1/containers", json={"name": "ttl"}, headers=k).json()["id"]
        assert h.post("/v1/containers", json={"name": "ttl"}, headers=k).json()["id"] == first
        time.sleep(2.1)  # created_at is in whole seconds
        assert h.post("/v1/containers", json={"name": "ttl"}, headers=k).json()["id"] != first


def test_a_create_cut_off_by_a_crash_is_not_made_twice(server_factory: Any) -> None:
    # No warm pool and 4g: the container is started after its record is written, so there is
    # a window where it is listed but the client has no answer yet. Kill -9 in it.
    env = {"SHELLBOX_LIFECYCLE__WARM_POOL_SIZE": "0"}
    first = server_factory(env=env)
    auth = {"authorization": "Bearer k"}
    h = httpx.Client(base_url=first.root_url, headers=auth, timeout=60)
    k = key()
    body = {"name": "crash", "memory_limit": "4g"}
    answered: list[httpx.Response] = []

    t = threading.Thread(
        target=post_dying, args=(h, "/v1/containers", answered), kwargs={"json": body, "headers": k}
    )
    t.start()
    lister = httpx.Client(base_url=first.root_url, headers=auth, timeout=5)
    assert wait_until(lambda: bool(lister.get("/v1/containers").json()["data"]), WAIT_S, 0.005)
    first.kill()
    t.join(10)
    lister.close()
    h.close()
    assert not answered, "the create answered before the kill: no crash window was hit"

    second = server_factory(state_dir=first.state_dir, env=env)
    sdk = openai.OpenAI(base_url=second.base_url, api_key="k", max_retries=0)
    [made] = sdk.containers.list().data
    with httpx.Client(base_url=second.root_url, headers=auth, timeout=60) as h2:
        retry = h2.post("/v1/containers", json=body, headers=k)
        assert retry.status_code == 200, retry.text
        assert retry.json()["id"] == made.id
        assert [c.id for c in sdk.containers.list()] == [made.id]
        assert shell(h2, made.id, "echo ok")["output"][0]["stdout"] == "ok\n"
        # A call cut off by a crash is not run again under its key: it may have had effects.
        item = {"type": "shell_call", "call_id": "c", "action": {"commands": ["sleep 30"]}}
        kc = key()
        cut: list[httpx.Response] = []
        url = f"/v1/containers/{made.id}/calls"
        t = threading.Thread(
            target=post_dying, args=(h2, url, cut), kwargs={"json": item, "headers": kc}
        )
        t.start()
        time.sleep(1)
        second.kill()
        t.join(10)
    third = server_factory(state_dir=first.state_dir, env=env)
    with httpx.Client(base_url=third.root_url, headers=auth, timeout=60) as h3:
        r = h3.post(f"/v1/containers/{made.id}/calls", json=item, headers=kc)
        assert r.status_code == 409, r.text
        assert error_of(r)["code"] == "idempotency_key_interrupted"
        assert r.headers["x-should-retry"] == "false"
