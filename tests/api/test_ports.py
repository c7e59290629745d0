"""Services inside containers through the server: ``/v1/containers/{id}/ports/{port}/...``
with the key, ``/v1/port-links/{token}/...`` with a link; HTTP and WebSocket, streamed.

The containers here have no network (the default): the server reaches their loopback from
its side, the containers still have no route out.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from shellbox.client import AsyncShellbox, Shellbox

ECHO_APP = (Path(__file__).parent / "sandbox_apps" / "echo_server.py").read_bytes()


def run(http: httpx.Client, cid: str, *commands: str) -> list[dict[str, Any]]:
    item = {"type": "shell_call", "call_id": "c1", "action": {"commands": list(commands)}}
    r = http.post(f"/v1/containers/{cid}/calls", json=item)
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["output"]
    return out


def wait_listening(http: httpx.Client, cid: str, port: int) -> None:
    for _ in range(200):
        r = http.get(f"/v1/containers/{cid}/ports/{port}/")
        if r.status_code != 502:
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing came up on port {port}: {r.text}")


def start_http_server(http: httpx.Client, cid: str, port: int = 8000) -> None:
    out = run(
        http,
        cid,
        "mkdir -p site && echo hello from the sandbox > site/hello.txt",
        f"cd site && nohup python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &",
    )
    assert all(o["outcome"]["exit_code"] == 0 for o in out), out
    wait_listening(http, cid, port)


@pytest.fixture
def echo(http: httpx.Client, cid: str) -> Iterator[str]:
    """The container ``cid`` with the echo app (``sandbox_apps/echo_server.py``) on 8001."""
    encoded = base64.b64encode(ECHO_APP).decode()
    run(
        http,
        cid,
        f"echo {encoded} | base64 -d > /tmp/echo_server.py",
        "nohup python3 /tmp/echo_server.py 8001 >/tmp/echo.log 2>&1 &",
    )
    wait_listening(http, cid, 8001)
    yield cid


def make_link(http: httpx.Client, cid: str, port: int, **body: Any) -> dict[str, Any]:
    r = http.post(f"/v1/containers/{cid}/ports/{port}/links", json=body)
    assert r.status_code == 200, r.text
    link: dict[str, Any] = r.json()
    return link


def test_python_http_server_through_the_key_route_and_a_link(
    http: httpx.Client, cid: str, server: Any
) -> None:
    start_http_server(http, cid)
    r = http.get(f"/v1/containers/{cid}/ports/8000/hello.txt")
    assert r.status_code == 200, r.text
    assert r.text == "hello from the sandbox\n"

    keyless = httpx.get(f"{server.base_url}/containers/{cid}/ports/8000/hello.txt")
    assert keyless.status_code == 401
    assert keyless.json()["error"]["code"] == "invalid_api_key"

    before = time.time()
    link = make_link(http, cid, 8000)
    assert before + 3600 - 5 <= link["expires_at"] <= time.time() + 3600 + 5
    assert link["url"].startswith(f"{server.root_url}/v1/port-links/")
    page = httpx.get(link["url"])  # no key
    assert page.status_code == 200
    assert 'href="hello.txt"' in page.text  # the listing's relative links resolve under it
    assert page.headers["content-security-policy"].startswith("sandbox allow-scripts")
    assert httpx.get(link["url"] + "hello.txt").text == "hello from the sandbox\n"
    # The service's root without the slash: redirected where its relative links work.
    bare = httpx.get(link["url"].rstrip("/"))
    assert bare.status_code == 307 and bare.headers["location"] == link["url"]


def test_expired_and_altered_links_are_refused(http: httpx.Client, cid: str) -> None:
    start_http_server(http, cid)
    link = make_link(http, cid, 8000, expires_in=1)
    assert httpx.get(link["url"] + "hello.txt").status_code == 200
    time.sleep(1.6)
    expired = httpx.get(link["url"] + "hello.txt")
    assert expired.status_code == 401
    assert expired.json()["error"]["code"] == "link_expired"
    assert "expired at" in expired.json()["error"]["message"]

    good = make_link(http, cid, 8000)["url"]
    token = good.split("/port-links/")[1].rstrip("/")
    payload, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["c"] == cid and claims["o"] == 8000
    # Another port, same signature; a flipped signature byte; a truncated token.
    claims["o"] = 8001
    other = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    flipped = mac[:-2] + ("A" if mac[-2] != "A" else "B") + mac[-1]
    base = good.split("/port-links/")[0] + "/port-links/"
    for bad in (f"{other}.{mac}", f"{payload}.{flipped}", payload, f"{payload}."):
        r = httpx.get(f"{base}{bad}/hello.txt")
        assert r.status_code == 401, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_link"


def test_link_lifetimes_are_bounded(http: httpx.Client, cid: str) -> None:
    for expires_in in (0, -5, 7 * 24 * 3600 + 1):
        r = http.post(f"/v1/containers/{cid}/ports/8000/links", json={"expires_in": expires_in})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "expires_in"
    for port in (0, 65536):
        r = http.post(f"/v1/containers/{cid}/ports/{port}/links", json={})
        assert r.status_code == 400 and r.json()["error"]["param"] == "port", r.text
        assert http.get(f"/v1/containers/{cid}/ports/{port}/").status_code == 400
    assert http.get(f"/v1/containers/{cid}/ports/http/").status_code == 400


def test_another_projects_key_gets_404(http: httpx.Client, cid: str, server: Any) -> None:
    start_http_server(http, cid)
    other = {"authorization": f"Bearer {server.create_key('ports-other')}"}
    for method, url in (
        ("GET", f"/v1/containers/{cid}/ports/8000/hello.txt"),
        ("POST", f"/v1/containers/{cid}/ports/8000/links"),
    ):
        r = http.request(method, url, headers=other, json={} if method == "POST" else None)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "container_not_found"
    with pytest.raises(InvalidStatus) as refused:
        ws_connect(
            f"ws://127.0.0.1:{server.port}/v1/containers/{cid}/ports/8000/",
            additional_headers=other,
        )
    assert refused.value.response.status_code == 404


def test_nothing_listening_is_a_502_that_says_so(http: httpx.Client, cid: str) -> None:
    r = http.get(f"/v1/containers/{cid}/ports/8009/")
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "port_not_listening"
    assert "127.0.0.1:8009" in r.json()["error"]["message"]


def test_the_request_is_forwarded_as_sent_without_the_key(
    http: httpx.Client, echo: str, api_key: str
) -> None:
    url = f"/v1/containers/{echo}/ports/8001/a%20b/c?x=1&y=%2F"
    r = http.request("PATCH", url, content=b"payload", headers={"x-custom": "v", "cookie": "s=1"})
    assert r.status_code == 200 and r.headers["x-echo"] == "yes"
    seen = r.json()
    assert seen["method"] == "PATCH"
    assert seen["path"] == "/a%20b/c?x=1&y=%2F"
    headers = dict(seen["headers"])
    assert headers["x-custom"] == "v" and headers["cookie"] == "s=1"
    assert headers["host"] == "127.0.0.1:8001"
    assert headers["x-forwarded-prefix"] == f"/v1/containers/{echo}/ports/8001"
    assert "authorization" not in headers
    assert api_key not in r.text
    assert seen["body_sha256"] == hashlib.sha256(b"payload").hexdigest()


def test_large_and_chunked_bodies_are_streamed_to_the_service(
    http: httpx.Client, echo: str
) -> None:
    """A body larger than any JSON body the server takes goes through whole, sent as it
    arrives: with a length, and chunked (a generator, no length)."""
    body = os.urandom(24 << 20)
    r = http.post(f"/v1/containers/{echo}/ports/8001/upload", content=body)
    assert r.status_code == 200, r.text
    assert r.json()["body_bytes"] == len(body)
    assert r.json()["body_sha256"] == hashlib.sha256(body).hexdigest()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 1 << 20):
            yield body[i : i + (1 << 20)]

    r = http.post(f"/v1/containers/{echo}/ports/8001/upload", content=chunks())
    assert r.status_code == 200, r.text
    assert r.json()["body_sha256"] == hashlib.sha256(body).hexdigest()


def test_the_answer_is_streamed_as_the_service_writes_it(
    http: httpx.Client, echo: str, server: Any
) -> None:
    """``/stream`` sends its first line, then waits for ``/release``: its first line must
    reach the client while the answer is still unfinished."""
    with http.stream("GET", f"/v1/containers/{echo}/ports/8001/stream") as r:
        lines = r.iter_lines()
        assert next(lines) == "first"
        assert http.get(f"/v1/containers/{echo}/ports/8001/release").status_code == 200
        assert next(lines) == "last"


def test_a_websocket_service_is_reached_with_the_key_and_a_link(
    http: httpx.Client, echo: str, server: Any, api_key: str
) -> None:
    url = f"ws://127.0.0.1:{server.port}/v1/containers/{echo}/ports/8001/ws?q=1"
    headers = {"authorization": f"Bearer {api_key}"}
    with ws_connect(url, additional_headers=headers, subprotocols=["chat"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "chat"
        ws.send("hello")
        assert ws.recv() == "echo:hello"
        ws.send(b"\x00\x01" * 40000)  # 80 kB: the long length form, binary
        assert ws.recv() == b"echo:" + b"\x00\x01" * 40000

    with pytest.raises(InvalidStatus) as refused:
        ws_connect(url)
    assert refused.value.response.status_code == 401

    link = make_link(http, echo, 8001)["url"].replace("http://", "ws://")
    with ws_connect(link + "ws") as ws:
        ws.send("via link")
        assert ws.recv() == "echo:via link"


def test_a_paused_container_is_woken_by_its_port(http: httpx.Client, cid: str) -> None:
    start_http_server(http, cid)
    assert http.post(f"/v1/containers/{cid}/pause").status_code == 200
    assert http.get(f"/v1/containers/{cid}").json()["status"] != "running"
    r = http.get(f"/v1/containers/{cid}/ports/8000/hello.txt")
    assert r.status_code == 200 and r.text == "hello from the sandbox\n"
    assert http.get(f"/v1/containers/{cid}").json()["status"] == "running"


def test_the_client_makes_port_urls_and_links(
    server: Any, api_key: str, http: httpx.Client, cid: str
) -> None:
    start_http_server(http, cid)
    with Shellbox(base_url=server.base_url, api_key=api_key) as sb:
        url = sb.port_url(cid, 8000, "hello.txt")
        assert url == f"{server.base_url}/containers/{cid}/ports/8000/hello.txt"
        r = httpx.get(url, headers={"authorization": f"Bearer {api_key}"})
        assert r.text == "hello from the sandbox\n"
        link = sb.ports.create_link(cid, 8000, expires_in=120)
        assert link.port == 8000 and link.container_id == cid
        assert abs(link.expires_at - (time.time() + 120)) < 5
        assert httpx.get(link.url + "hello.txt").text == "hello from the sandbox\n"
        with pytest.raises(ValueError, match="port must be between"):
            sb.port_url(cid, 0)


async def test_the_async_client_makes_links_too(
    server: Any, api_key: str, http: httpx.Client, cid: str
) -> None:
    start_http_server(http, cid)
    async with AsyncShellbox(base_url=server.base_url, api_key=api_key) as sb:
        assert (
            sb.port_url(cid, 8000, "/a?b=1")
            == f"{server.base_url}/containers/{cid}/ports/8000/a?b=1"
        )
        link = await sb.ports.create_link(cid, 8000)
        async with httpx.AsyncClient() as h:
            assert (await h.get(link.url + "hello.txt")).text == "hello from the sandbox\n"


def test_cookies_and_redirects_stay_under_the_services_prefix(
    http: httpx.Client, echo: str
) -> None:
    """The server's origin is shared by every container's services and the console: a
    service's cookie is kept to its own path, and its redirects to its own absolute paths
    stay under its prefix."""
    prefix = f"/v1/containers/{echo}/ports/8001"
    r = http.get(f"{prefix}/redirect")
    assert r.status_code == 302
    assert r.headers["location"] == f"{prefix}/target?x=1"
    assert r.headers["set-cookie"] == f"sid=abc; HttpOnly; Path={prefix}/"


def test_the_port_routes_answer_like_every_other_route(http: httpx.Client, cid: str) -> None:
    """The port routes are answered before the API's router (``api/port_gateway.py``): the
    same request id, checks and error envelope as every route."""
    start_http_server(http, cid)
    ok = http.get(f"/v1/containers/{cid}/ports/8000/hello.txt")
    assert ok.status_code == 200 and ok.headers["x-request-id"].startswith("req_")
    missing = http.get("/v1/containers/cntr_nope/ports/8000/")
    assert missing.status_code == 404 and missing.headers["x-request-id"].startswith("req_")
    assert missing.json()["error"]["param"] == "container_id", missing.text
    nul = http.get(f"/v1/containers/{cid}/ports/8000/a%00b")
    assert nul.status_code == 400 and nul.json()["error"]["param"] == "path", nul.text
    query = http.get(f"/v1/containers/{cid}/ports/8000/", params={"q": "a\x00b"})
    assert query.status_code == 400 and query.json()["error"]["param"] == "q", query.text
    assert http.request("TRACE", f"/v1/containers/{cid}/ports/8000/").status_code == 405
    url = f"{str(http.base_url).rstrip('/')}/v1/containers/{cid}/ports/8000/"
    keyless = httpx.get(url)
    assert keyless.status_code == 401 and "API key" in keyless.json()["error"]["message"]
    assert httpx.get(url, headers={"authorization": "Basic x"}).status_code == 401
