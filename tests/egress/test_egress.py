"""Egress end to end: real containers behind the real proxy, talking to the local upstream.

One allowlist container per module (``api.example.test`` with a secret, ``other.example.test``,
and ``*.files.example.test``); every check runs real tools in it (curl, python3, pip's
requests, git, node).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from egress_helpers import (
    NOCERT_NAME,
    UP_HOST_IP,
    UP_IP,
    WAIT_S,
    EgressServer,
    Upstream,
    create,
    run,
    wait_for,
)

SECRET = "sk-live-0123456789abcdef-egress-test"
POLICY = {
    "type": "allowlist",
    "allowed_domains": ["api.example.test", "other.example.test", "*.files.example.test"],
    "domain_secrets": [{"domain": "api.example.test", "name": "API_KEY", "value": SECRET}],
}
CURL = "curl -sS --connect-timeout 5 -m 20"


@pytest.fixture(scope="module")
def box(egress: EgressServer) -> Iterator[str]:
    with egress.http as http:
        cid = create(http, POLICY, name="egress-main")
        yield cid
        http.delete(f"/v1/containers/{cid}")


def out1(http: Any, cid: str, command: str, timeout_ms: int = 30_000) -> dict[str, Any]:
    [result] = run(http, cid, command, timeout_ms=timeout_ms)
    return dict(result)


def exit_code(result: dict[str, Any]) -> int:
    return int(result["outcome"]["exit_code"])


# -- allowed traffic ------------------------------------------------------------------------


def test_allowed_host_with_curl_python_requests_and_git(
    egress: EgressServer, box: str, upstream: Upstream
) -> None:
    upstream.clear()
    with egress.http as http:
        curl_https, curl_http, urllib, requests, git = run(
            http,
            box,
            f"{CURL} https://api.example.test/echo",
            f"{CURL} http://other.example.test/echo?q=1",
            'python3 -c "import json, urllib.request; '
            "print(json.load(urllib.request.urlopen('https://other.example.test/echo'))['host'])\"",
            # pip's own HTTP stack: what `pip install` uses (it honours REQUESTS_CA_BUNDLE)
            'python3 -c "from pip._vendor import requests; '
            "r = requests.get('https://api.example.test/echo', timeout=20); "
            "print(r.status_code, r.json()['tls'])\"",
            "GIT_TERMINAL_PROMPT=0 git ls-remote https://api.example.test/repo.git; true",
        )
    assert json.loads(curl_https["stdout"])["tls"] is True, curl_https
    assert json.loads(curl_http["stdout"])["tls"] is False, curl_http
    assert urllib["stdout"].strip() == "other.example.test", urllib
    assert requests["stdout"].split() == ["200", "True"], requests
    # git's TLS and proxy handling worked: the request reached the upstream (which is no git
    # server, hence git's complaint about the answer rather than about the connection).
    assert "SSL" not in git["stderr"] and "certificate" not in git["stderr"], git
    paths = [s["path"] for s in upstream.seen()]
    assert any(p.startswith("/repo.git/info/refs") for p in paths), paths
    assert {"/echo", "/echo?q=1"} <= set(paths)


NODE_SCRIPT = r"""
const https = require("node:https");
const get = (url, headers) => new Promise((resolve, reject) => {
  https.get(url, { headers }, (res) => {
    let body = "";
    res.on("data", (c) => (body += c));
    res.on("end", () => resolve(JSON.parse(body)));
  }).on("error", reject);
});
(async () => {
  const viaHttps = await get("https://api.example.test/echo?via=node-https",
                             { authorization: `Bearer ${process.env.API_KEY}` });
  const viaFetch = await (await fetch("http://other.example.test/echo?via=node-fetch")).json();
  const tlsFetch = await (await fetch("https://other.example.test/echo?via=node-fetch-tls")).json();
  let refused = "not refused";
  try { await fetch("https://blocked.example.test/"); } catch (e) { refused = String(e.cause); }
  let local = "reached";  // NO_PROXY: loopback is not sent to the proxy
  try { await fetch("http://localhost:8999/"); } catch (e) { local = String(e.cause.code); }
  console.log(JSON.stringify({ https: viaHttps.tls, fetch: viaFetch.host,
                               fetchTls: tlsFetch.tls, refused, local }));
})();
"""


def test_node_https_and_fetch_go_through_the_proxy(
    egress: EgressServer, box: str, upstream: Upstream
) -> None:
    """node (22.16 in the default image) ignores the proxy variables; the preload shellbox
    gives it routes https and fetch through the proxy, so scripts (ES modules too) work
    unchanged and the policy and secrets apply."""
    upstream.clear()
    esm = 'const r = await fetch("https://other.example.test/echo?via=node-esm"); '
    esm += "console.log((await r.json()).tls)"
    with egress.http as http:
        version = out1(http, box, "node --version")["stdout"]
        result = out1(http, box, f"node -e '{NODE_SCRIPT}'")
        placeholder = out1(http, box, 'printf %s "$API_KEY"')["stdout"]
        module = out1(http, box, f"node --input-type=module -e '{esm}'")
    assert version.startswith("v22.16."), version
    assert (module["stdout"], module["stderr"]) == ("true\n", ""), module
    assert result["stderr"] == "", result
    out = json.loads(result["stdout"])
    assert out["https"] is True and out["fetch"] == "other.example.test", out
    assert out["fetchTls"] is True, out
    assert "blocked.example.test" in out["refused"] and "403" in out["refused"], out
    assert out["local"] == "ECONNREFUSED", out
    seen = {s["path"]: s["headers"] for s in upstream.seen()}
    assert seen["/echo?via=node-https"]["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in result["stdout"] and placeholder.startswith("shellbox-secret-")
    assert {"/echo?via=node-fetch", "/echo?via=node-fetch-tls"} <= set(seen)


def test_glob_entry_allows_subdomains(egress: EgressServer) -> None:
    policy = {"type": "allowlist", "allowed_domains": ["*.example.test"]}
    with egress.http as http:
        cid = create(http, policy)
        ok, bare = run(
            http,
            cid,
            f"{CURL} -o /dev/null -w '%{{http_code}}' https://sub.api.example.test/echo",
            f"{CURL} -o /dev/null -w '%{{http_code}}' http://example.test/",
        )
        http.delete(f"/v1/containers/{cid}")
    assert ok["stdout"] == "200", ok
    assert bare["stdout"] == "520", bare  # '*.example.test' does not cover 'example.test'


def test_upstream_tls_is_verified(egress: EgressServer) -> None:
    """The proxy checks the upstream's certificate (here: valid, but not for this name)."""
    with egress.http as http:
        cid = create(http, {"type": "allowlist", "allowed_domains": [NOCERT_NAME]})
        [r] = run(http, cid, f"{CURL} -i https://{NOCERT_NAME}/echo")

        def events_of() -> list[dict[str, Any]]:
            data: list[dict[str, Any]] = http.get(f"/v1/containers/{cid}/egress").json()["data"]
            return data

        # The proxy writes its audit rows on its own pace: wait for the one this is about.
        wait_for(lambda: any("upstream TLS failed" in str(e["reason"]) for e in events_of()))
        events = events_of()
        http.delete(f"/v1/containers/{cid}")
    assert " 502 " in r["stdout"] and "Certificate verify failed" in r["stdout"], r
    assert any("upstream TLS failed" in str(e["reason"]) for e in events), events


# -- refused traffic ------------------------------------------------------------------------


def test_hosts_outside_the_policy_are_refused(egress: EgressServer, box: str) -> None:
    with egress.http as http:
        plain, tls, sub, ip_plain, ip_tls, port8080, port22 = run(
            http,
            box,
            f"{CURL} -i http://blocked.example.test/echo",
            f"{CURL} https://blocked.example.test/echo",
            f"{CURL} https://sub.api.example.test/echo",  # an exact entry covers no subdomain
            f"{CURL} -i http://{UP_IP}/echo",
            f"{CURL} https://{UP_IP}/echo",
            f"{CURL} -i http://api.example.test:8080/echo",
            f"{CURL} https://api.example.test:22/",
        )
    assert plain["stdout"].startswith("HTTP/1.1 520"), plain
    assert "not in the container's network_policy allowlist" in plain["stdout"]
    assert "api.example.test" in plain["stdout"]  # the body names the policy
    for r in (tls, sub, ip_tls, port22):
        assert exit_code(r) != 0 and "CONNECT tunnel failed, response 403" in r["stderr"], r
    assert ip_plain["stdout"].startswith("HTTP/1.1 520"), ip_plain
    assert "not IP addresses" in ip_plain["stdout"]
    assert port8080["stdout"].startswith("HTTP/1.1 520"), port8080
    assert "allows only ports 80 and 443" in port8080["stdout"]


def test_direct_connections_and_udp_fail(egress: EgressServer, box: str) -> None:
    """Ignoring the proxy variables gets nowhere: not the upstream, not the host, not UDP."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", 0))
    udp.settimeout(0.5)
    udp_port = udp.getsockname()[1]
    with egress.http as http:
        proxy = out1(http, box, "echo $HTTPS_PROXY")["stdout"].strip()
        host_end = proxy.split("//")[1].split(":")[0]
        direct, resolve, udp_send = run(
            http,
            box,
            f"{CURL} --noproxy '*' https://{UP_IP}/echo",
            f"{CURL} --noproxy '*' --resolve api.example.test:443:{UP_IP} "
            "https://api.example.test/echo",
            'python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
            f"[s.sendto(b'leak', (a, {udp_port})) for a in ('{host_end}', '{UP_HOST_IP}')]; "
            "print('sent')\"",
        )
    try:
        with pytest.raises(TimeoutError):
            udp.recvfrom(100)  # nothing arrived
    finally:
        udp.close()
    for r in (direct, resolve):
        assert exit_code(r) != 0, r
    assert udp_send["stdout"].strip() == "sent"
    # the upstream itself was up all along: the host reaches it
    with socket.create_connection((UP_IP, 443), timeout=5):
        pass


@contextlib.contextmanager
def host_listeners() -> Iterator[tuple[list[int], list[str]]]:
    """TCP services on this host, on 0.0.0.0 and on 127.0.0.1, recording who connects."""
    accepted: list[str] = []
    socks: list[socket.socket] = []
    stop = threading.Event()

    def serve(s: socket.socket) -> None:
        while not stop.is_set():
            try:
                conn, peer = s.accept()
            except (TimeoutError, OSError):
                continue
            accepted.append(peer[0])
            conn.close()

    threads = []
    try:
        for addr in ("0.0.0.0", "127.0.0.1"):
            s = socket.socket()
            socks.append(s)
            s.bind((addr, 0))
            s.listen()
            s.settimeout(0.2)
            threads.append(threading.Thread(target=serve, args=(s,), daemon=True))
        for t in threads:
            t.start()
        yield [s.getsockname()[1] for s in socks], accepted
    finally:
        stop.set()
        for t in threads:
            t.join()
        for s in socks:
            s.close()


def _host_ip() -> str:
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "get", "1.1.1.1"], capture_output=True, text=True
    ).stdout.split()
    return out[out.index("src") + 1] if "src" in out else "127.0.0.1"


def test_host_services_are_unreachable(egress: EgressServer, box: str) -> None:
    """Services on the host's 0.0.0.0 and 127.0.0.1, directly and through the proxy."""
    with host_listeners() as (ports, accepted), egress.http as http:
        # sanity: the listeners work for whoever may reach them
        for p in ports:
            with socket.create_connection(("127.0.0.1", p), timeout=2):
                pass
        wait_for(lambda: len(accepted) >= 2)  # accepted by their threads
        assert len(accepted) == 2, "the host listeners do not work"
        accepted.clear()
        proxy = out1(http, box, "echo $HTTPS_PROXY")["stdout"].strip()
        host_end = proxy.split("//")[1].split(":")[0]
        targets = [host_end, UP_HOST_IP, _host_ip()]
        probe = "; ".join(
            f"python3 -c \"import socket; socket.create_connection(('{a}', {p}), timeout=3)\" "
            f"2>/dev/null && echo OPEN-{a}-{p}"
            for a in targets
            for p in ports
        )
        direct = out1(http, box, probe + "; true")
        any_cid = create(http, {"type": "allowlist", "allowed_domains": ["*"]})
        via_proxy = run(
            http,
            any_cid,
            f"{CURL} -i http://hostsvc.example.test:{ports[0]}/",  # port: refused anyway
            f"{CURL} -i http://hostsvc.example.test/",  # a name for this host's address
            f"{CURL} -i --noproxy '' -x \"$HTTP_PROXY\" http://localhost/",  # not NO_PROXY
            f"{CURL} -i http://{host_end}/",
            f"{CURL} -o /dev/null -w '%{{http_code}}' http://{UP_IP}/echo",  # '*' allows IPs
        )
        events = http.get(f"/v1/containers/{any_cid}/egress", params={"limit": 100}).json()
        http.delete(f"/v1/containers/{any_cid}")
        time.sleep(0.3)
    assert "OPEN" not in direct["stdout"], direct
    assert accepted == [], accepted
    assert via_proxy[0]["stdout"].startswith("HTTP/1.1 520"), via_proxy[0]
    for r in via_proxy[1:4]:
        assert not r["stdout"].startswith("HTTP/1.1 200"), r
        assert r["stdout"].startswith("HTTP/1.1 502"), r
    assert via_proxy[4]["stdout"] == "200", via_proxy[4]
    reasons = " ".join(str(e["reason"]) for e in events["data"])
    assert "address of the proxy's own host" in reasons, reasons
    assert "loopback" in reasons and "sandbox network" in reasons, reasons


def test_other_containers_are_unreachable(egress: EgressServer, box: str) -> None:
    with egress.http as http:
        other = create(http, {"type": "allowlist", "allowed_domains": ["api.example.test"]})
        serve = (
            "nohup python3 -m http.server 8080 --bind 0.0.0.0 >/dev/null 2>&1 & "
            "for i in $(seq 50); do curl -s -o /dev/null --noproxy '*' http://127.0.0.1:8080/ "
            "&& echo up && break; sleep 0.1; done"
        )
        assert out1(http, other, serve)["stdout"].strip() == "up"
        proxy = out1(http, other, "echo $HTTPS_PROXY")["stdout"].strip()
        host_end = proxy.split("//")[1].split(":")[0]
        other_ip = host_end.rsplit(".", 1)[0] + "." + str(int(host_end.rsplit(".", 1)[1]) + 1)
        direct, via_proxy = run(
            http,
            box,
            f"{CURL} --noproxy '*' http://{other_ip}:8080/",
            f"{CURL} -i http://{other_ip}:8080/",
        )
        http.delete(f"/v1/containers/{other}")
    assert exit_code(direct) != 0, direct
    assert via_proxy["stdout"].startswith("HTTP/1.1 520"), via_proxy


def test_disabled_policy_keeps_loopback_only(egress: EgressServer, upstream: Upstream) -> None:
    with egress.http as http:
        cid = create(http, None)
        links, env, curl = run(
            http,
            cid,
            "ip -o link | cut -d: -f2",  # (/sys shows the host's: it is the host's sysfs)
            "env | grep -i proxy; true",
            f"{CURL} --noproxy '*' https://{UP_IP}/echo",
        )
        body = http.get(f"/v1/containers/{cid}").json()
        http.delete(f"/v1/containers/{cid}")
    assert links["stdout"].split() == ["lo"], links
    assert env["stdout"] == "", env
    assert exit_code(curl) != 0, curl
    assert body["network_policy"] == {"type": "disabled"}


# -- secrets --------------------------------------------------------------------------------


def test_secret_injected_only_for_its_domain(
    egress: EgressServer, box: str, upstream: Upstream
) -> None:
    upstream.clear()
    with egress.http as http:
        placeholder = out1(http, box, 'printf %s "$API_KEY"')["stdout"]
        echo_api, echo_other, basic, big = run(
            http,
            box,
            f'{CURL} -H "Authorization: Bearer $API_KEY" https://api.example.test/echo',
            f'{CURL} -H "Authorization: Bearer $API_KEY" https://other.example.test/echo',
            f'{CURL} -u "user:$API_KEY" https://api.example.test/echo?via=basic',
            # a large (streamed) answer that repeats the header: scrubbed across chunks too
            f'{CURL} -H "X-Key: $API_KEY" "https://api.example.test/echo-big?n=3000000" '
            f"| grep -o '{placeholder}' | wc -l",
        )
    assert placeholder.startswith("shellbox-secret-") and SECRET not in placeholder
    seen = {(s["host"], s["path"]): s["headers"] for s in upstream.seen()}
    assert seen[("api.example.test", "/echo")]["authorization"] == f"Bearer {SECRET}"
    assert seen[("other.example.test", "/echo")]["authorization"] == f"Bearer {placeholder}"
    basic_seen = seen[("api.example.test", "/echo?via=basic")]["authorization"]
    assert base64.b64decode(basic_seen.removeprefix("Basic ")).decode() == f"user:{SECRET}"
    assert seen[("api.example.test", "/echo-big?n=3000000")]["x-key"] == SECRET
    # what came back into the sandbox carries the placeholder, never the value
    for r in (echo_api, echo_other, basic):
        assert SECRET not in r["stdout"], r
    assert json.loads(echo_api["stdout"])["headers"]["authorization"] == f"Bearer {placeholder}"
    assert int(big["stdout"]) > 100, big  # every copy in the 3 MB body was put back


def test_secret_value_never_reaches_the_sandbox_or_the_api(
    egress: EgressServer, box: str, upstream: Upstream
) -> None:
    with egress.http as http:
        # make sure it has been used (and echoed back) before looking for it
        out1(http, box, f'{CURL} -H "Authorization: Bearer $API_KEY" https://api.example.test/echo')
        env, environ, files = run(
            http,
            box,
            f"env | grep -c -- '{SECRET}'; true",
            f"cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c -- '{SECRET}'; true",
            # every file the sandbox can read (unreadable ones make grep exit 2: count matches)
            f"grep -rlsF --exclude-dir=proc --exclude-dir=sys -- '{SECRET}' / | wc -l",
            timeout_ms=120_000,
        )
        api_views = [
            http.get(f"/v1/containers/{box}").text,
            http.get("/v1/containers").text,
            http.get(f"/v1/containers/{box}/egress", params={"limit": 100}).text,
        ]
    assert env["stdout"].strip() == "0", env
    assert environ["stdout"].strip() == "0", environ
    assert files["stdout"].strip() == "0", files
    for text in api_views:
        assert SECRET not in text
    assert json.loads(api_views[0])["network_policy"] == {
        "type": "allowlist",
        "allowed_domains": POLICY["allowed_domains"],
    }
    # on the host: the container's own tree (its spec; its disk, mounted in the server's
    # namespace only), and the server's logs
    state = egress.server.state_dir
    disk = egress.server.view(state / "disks" / box)
    assert (disk / "data").is_dir()  # (else the grep below would look at nothing)
    found = subprocess.run(
        ["grep", "-rlsF", "--", SECRET, str(state / "containers" / box), str(disk)],
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", found.stdout
    for log in (egress.server.log_path, state / "egress" / "proxy.log"):
        assert log is not None and SECRET not in log.read_text(errors="replace"), log


# -- audit ----------------------------------------------------------------------------------


def test_audit_lists_allowed_and_refused_attempts(egress: EgressServer) -> None:
    with egress.http as http:
        cid = create(http, {"type": "allowlist", "allowed_domains": ["api.example.test"]})
        run(
            http,
            cid,
            f"{CURL} -o /dev/null https://api.example.test/echo?token=hidden",
            f"{CURL} -o /dev/null -X POST --data-binary @/etc/os-release http://api.example.test/up",
            f"{CURL} -o /dev/null https://blocked.example.test/",
            f"{CURL} -o /dev/null http://blocked.example.test/x?y=1",
        )
        deadline = time.monotonic() + WAIT_S
        while True:
            page = http.get(f"/v1/containers/{cid}/egress", params={"order": "asc"}).json()
            if len(page["data"]) >= 4 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        first = http.get(f"/v1/containers/{cid}/egress", params={"limit": 2, "order": "asc"})
        second = http.get(
            f"/v1/containers/{cid}/egress",
            params={"limit": 2, "order": "asc", "after": first.json()["last_id"]},
        )
        other_key = egress.server.create_key("someone-else")
        foreign = http.get(
            f"/v1/containers/{cid}/egress", headers={"authorization": f"Bearer {other_key}"}
        )
        http.delete(f"/v1/containers/{cid}")
    events = page["data"]
    summary = [(e["method"], e["host"], e["port"], e["path"], e["decision"]) for e in events]
    assert summary == [
        ("GET", "api.example.test", 443, "/echo", "allowed"),
        ("POST", "api.example.test", 80, "/up", "allowed"),
        ("CONNECT", "blocked.example.test", 443, "", "refused"),
        ("GET", "blocked.example.test", 80, "/x", "refused"),
    ], summary
    get, post, connect, plain = events
    assert get["status_code"] == 200 and get["response_bytes"] > 0
    assert post["request_bytes"] > 0 and post["status_code"] == 200
    assert connect["status_code"] == 403 and plain["status_code"] == 520
    assert "hidden" not in json.dumps(events)  # no query strings
    assert all(e["object"] == "container.egress_event" and e["container_id"] == cid for e in events)
    assert first.json()["has_more"] is True and len(first.json()["data"]) == 2
    assert [e["id"] for e in second.json()["data"]] == [e["id"] for e in events[2:]]
    assert foreign.status_code == 404
