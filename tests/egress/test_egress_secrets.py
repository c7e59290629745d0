"""What an egress secret must withstand: an upstream on its domain that sends it back in any
trivially reversible form, requests that name another host than the one connected to, and
plain HTTP (real containers, real proxy, the local upstream's ``/reflect``)."""

from __future__ import annotations

import base64
import html
import re
import urllib.parse
from collections.abc import Iterator

import pytest
from egress_helpers import SNI_PROBE, EgressServer, Upstream, create, run

SECRET = "Sk-Live-0123456789abcdef/egress+Secret"
LONG = "eyJhbGciOiJSUzI1NiJ9." + "".join(f"{i:04x}Ab+/" for i in range(700))  # a JWT's size
POLICY = {
    "type": "allowlist",
    "allowed_domains": ["api.example.test", "other.example.test"],
    "domain_secrets": [
        {"domain": "api.example.test", "name": "API_KEY", "value": SECRET},
        {"domain": "api.example.test", "name": "LONG_KEY", "value": LONG},
    ],
}
CURL = "curl -sS --connect-timeout 5 -m 30"
FORMS = [
    "raw", "upper", "lower", "swapcase", "b64", "b64upper", "b64url", "b64mime", "hex",
    "hexupper", "url", "urlplus", "urlall", "json", "html", "htmlnum",
]  # fmt: skip


@pytest.fixture(scope="module")
def box(egress: EgressServer) -> Iterator[tuple[str, str]]:
    """An allowlist container with the secret, and its placeholder."""
    with egress.http as http:
        cid = create(http, POLICY, name="egress-secrets")
        [r] = run(http, cid, 'printf %s "$API_KEY"')
        yield cid, r["stdout"]
        http.delete(f"/v1/containers/{cid}")


def undone(data: bytes) -> list[bytes]:
    """``data`` and what undoing each trivially reversible encoding of it gives."""
    out = [data, urllib.parse.unquote_to_bytes(data.replace(b"+", b" "))]
    out.append(html.unescape(data.decode("latin-1")).encode("latin-1", "replace"))
    out.append(re.sub(rb"\\u00([0-9a-fA-F]{2})", lambda m: bytes.fromhex(m[1].decode()), data))
    for run_ in re.findall(rb"[0-9a-fA-F]{8,}", data):
        for off in (0, 1):
            part = run_[off:]
            out.append(bytes.fromhex(part[: len(part) // 2 * 2].decode()))
    for run_ in re.findall(rb"[A-Za-z0-9+/_\-\r\n]{8,}", data):
        clean = run_.replace(b"\r", b"").replace(b"\n", b"")
        for off in range(4):
            part = clean[off:]
            part = part[: len(part) // 4 * 4]
            out.append(base64.b64decode(part.replace(b"-", b"+").replace(b"_", b"/")))
    return out


def b64_cores(value: bytes) -> list[bytes]:
    """Pieces of the value's base64 at each alignment (inside any longer text), both alphabets."""
    cores = []
    for align in range(3):
        enc = base64.b64encode(b"\0" * align + value)
        core = enc[align + 1 : len(enc) - 3]
        cores += [core, core.replace(b"+", b"-").replace(b"/", b"_")]
    return cores


def readable(output: str, secret: str = SECRET) -> bool:
    """Whether the secret can be read back from ``output``, whatever the case of its letters."""
    value = secret.encode()
    # what the proxy sent may be base64 already (a Basic credential), then encoded again
    cores = b64_cores(value)
    cores += [c for core in cores for c in b64_cores(core)]
    level = [output.encode("latin-1", "replace")]
    for _ in range(2):
        for data in level:
            if any(core.lower() in data.lower() for core in cores):
                return True
        level = [u for data in level for u in undone(data)]
        if any(value.lower() in d.lower() for d in level):
            return True
    return False


def test_the_oracle_sees_every_form() -> None:
    """The check itself reads the secret back from each unscrubbed form (as main let out)."""
    import upstream as up

    for form in FORMS:
        for pre in (b"", b"a", b"ab", b"user:"):
            sent = up.reflect(form, pre + SECRET.encode()).decode()
            assert readable(f"x-reflect: {sent}\r\n\r\n{sent}"), (form, pre)
            basic = b"Basic " + base64.b64encode(pre + SECRET.encode())
            assert readable(up.reflect(form, basic).decode()), (form, pre)
    assert not readable("shellbox-secret-0123456789abcdef base64 dXNlcjpzaGVsbGJveA==")


def answer(out: str) -> str:
    """curl -i's output without the proxy's CONNECT answer."""
    return out.split("HTTP/1.1 200 Connection established\r\n\r\n")[-1]


def reflect(form: str, pre: str = "", header: str = "x-tok", extra: str = "") -> str:
    return f'"https://api.example.test/reflect?h={header}&form={form}&pre={pre}{extra}"'


def test_a_secret_never_comes_back_in_any_form(
    egress: EgressServer, box: tuple[str, str], upstream: Upstream
) -> None:
    """Every form is sent back in the status line, a header and the body: the sandbox reads
    the placeholder in its place, never the value (the upstream did get the value)."""
    cid, placeholder = box
    commands, labels = [], []
    for form in FORMS:
        for pre in ("", "a", "ab"):  # the three alignments of the value in base64
            commands.append(f'{CURL} -i {reflect(form, pre)} -H "X-Tok: $API_KEY"')
            labels.append(f"X-Tok {form} pre={pre!r}")
    for form in ("raw", "b64", "hexupper", "urlall", "json"):  # long values (JWTs)
        commands.append(f'{CURL} -i {reflect(form, "ab", "x-long")} -H "X-Long: $LONG_KEY"')
        labels.append(f"X-Long {form}")
    for form in ("raw", "b64", "upper", "hex", "urlall"):  # curl -u: a Basic credential
        commands.append(f'{CURL} -i {reflect(form, header="authorization")} -u "u:$API_KEY"')
        labels.append(f"Basic {form}")
    for form in ("raw", "b64"):  # a compressed body, though the proxy asked for none
        commands.append(
            f'{CURL} -i --compressed {reflect(form, extra="&gzip=1")} -H "X-Tok: $API_KEY"'
        )
        labels.append(f"gzip {form}")
    upstream.clear()
    with egress.http as http:
        results = run(http, cid, *commands, timeout_ms=120_000)
        long_placeholder = run(http, cid, 'printf %s "$LONG_KEY"')[0]["stdout"]
    for label, r in zip(labels, results, strict=True):
        out = r["stdout"]
        assert answer(out).startswith("HTTP/1.1 200 "), (label, r)
        assert not readable(out) and not readable(out, LONG), (label, out)
        assert (long_placeholder if "Long" in label else placeholder) in out, (label, out)
    seen = upstream.seen()
    assert len(seen) == len(commands)
    for s in seen:  # what reached the upstream: the value, not the placeholder
        if "x-tok" in s["headers"]:
            assert s["headers"]["x-tok"] == SECRET, s
        elif "x-long" in s["headers"]:
            assert s["headers"]["x-long"] == LONG, s
        else:
            basic = s["headers"]["authorization"].removeprefix("Basic ")
            assert base64.b64decode(basic).decode() == f"u:{SECRET}", s


def test_a_streamed_body_is_scrubbed_across_its_chunks(
    egress: EgressServer, box: tuple[str, str]
) -> None:
    """Bodies past the proxy's buffering size go through in chunks; copies of each form land
    across chunk borders (an odd padding), and none gets through."""
    cid, placeholder = box
    forms = ["raw", "b64", "b64mime", "urlall", "upper", "json"]
    commands = [
        f'{CURL} {reflect(form, "a", extra="&n=1500000")} -H "X-Tok: $API_KEY" '
        "| tr -d . | sort | uniq -c"
        for form in forms
    ]
    with egress.http as http:
        results = run(http, cid, *commands, timeout_ms=120_000)
    for form, r in zip(forms, results, strict=True):
        assert r["stderr"] == "", (form, r)
        counted = [line.split(None, 1) for line in r["stdout"].splitlines()]
        copies = sum(int(c[0]) for c in counted if len(c) == 2 and placeholder in c[1])
        assert copies > 1000, (form, r)
        assert not readable(r["stdout"]), (form, r["stdout"])


WS_PROBE = r"""
import os, socket, ssl, sys
proxy = os.environ["HTTPS_PROXY"].split("//")[1].split(":")
s = socket.create_connection((proxy[0], int(proxy[1])), timeout=10)
s.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\n")
assert s.recv(4096).startswith(b"HTTP/1.1 200"), "CONNECT refused"
t = ssl.create_default_context().wrap_socket(s, server_hostname="api.example.test")
key = os.environ["API_KEY"]
head = (
    f"GET /ws?h=x-tok&form={sys.argv[1]} HTTP/1.1\r\nHost: api.example.test\r\n"
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    f"X-Tok: {key}\r\n\r\n"
)
t.sendall(head.encode())
data = b""
try:
    while chunk := t.recv(65536):
        data += chunk
except (TimeoutError, ssl.SSLError, ConnectionError):
    pass
print(data.decode("latin-1"))
"""


def test_websocket_messages_are_scrubbed(egress: EgressServer, box: tuple[str, str]) -> None:
    """A WebSocket opened with the secret in its handshake: what the upstream sends back in
    its messages is scrubbed like a body."""
    cid, placeholder = box
    forms = ["raw", "b64", "hex", "upper"]
    with egress.http as http:
        results = run(http, cid, *(f"python3 -c '{WS_PROBE}' {form}" for form in forms))
    for form, r in zip(forms, results, strict=True):
        out = r["stdout"]
        assert out.startswith("HTTP/1.1 101"), (form, r)
        assert placeholder in out and not readable(out), (form, out)


def test_large_compressed_or_unannounced_bodies_are_scrubbed(
    egress: EgressServer, box: tuple[str, str], upstream: Upstream
) -> None:
    """gzip hides the value from a chunk-by-chunk scrubber: it is decoded on the way. A body
    of unannounced size (chunked) is turned into a stream by mitmproxy once it grows past the
    streaming size: it goes through the scrubber too."""
    cid, placeholder = box
    gz = reflect("raw", extra="&n=1500000&noise=1&gzip=1")
    chunked = reflect("raw", extra="&n=1500000&chunked=1")
    key = '-H "X-Tok: $API_KEY"'
    upstream.clear()
    with egress.http as http:
        gz_copies, gz_values, ch_copies, ch_values = run(
            http,
            cid,
            f'{CURL} --compressed {gz} {key} | grep -c "{placeholder}"',
            f"{CURL} --compressed {gz} {key} | grep -ci sk-live; true",
            f'{CURL} {chunked} {key} | grep -c "{placeholder}"',
            f"{CURL} {chunked} {key} | grep -ci sk-live; true",
            timeout_ms=120_000,
        )
    assert int(gz_copies["stdout"]) > 1000, gz_copies
    assert int(ch_copies["stdout"]) > 1000, ch_copies
    assert gz_values["stdout"].strip() == ch_values["stdout"].strip() == "0"
    assert len(upstream.seen()) == 4


# -- one host per request ---------------------------------------------------------------------


def test_a_request_for_another_host_than_the_connection_is_refused(
    egress: EgressServer, box: tuple[str, str], upstream: Upstream
) -> None:
    """Host, absolute URI and SNI must all name the host the proxy connects to (the secret's
    domain here): else 421 from the proxy, audited, and nothing reaches the upstream."""
    cid, _ = box
    upstream.clear()
    with egress.http as http:
        results = run(
            http,
            cid,
            # CONNECT api.example.test, then Host: another (allowed or not) host
            f'{CURL} -i -H "Host: other.example.test" -H "X-Tok: $API_KEY" '
            "https://api.example.test/echo",
            f'{CURL} -i -H "Host: blocked.example.test" -H "X-Tok: $API_KEY" '
            "https://api.example.test/echo",
            f'{CURL} -i -H "Host: api.example.test:8443" -H "X-Tok: $API_KEY" '
            "https://api.example.test/echo",
            # an absolute URI for one host, a Host header for another
            f'{CURL} -i -H "Host: blocked.example.test" http://other.example.test/echo',
            # CONNECT to the secret's domain with the SNI of another one
            f"python3 -c '{SNI_PROBE}' api.example.test files.example.test",
            f"python3 -c '{SNI_PROBE}' other.example.test blocked.example.test",
            # and the same requests with matching names still work
            f'{CURL} -o /dev/null -w "%{{http_code}}" -H "Host: api.example.test:443" '
            '-H "X-Tok: $API_KEY" https://api.example.test/echo',
            f"python3 -c '{SNI_PROBE}' api.example.test api.example.test",
        )
        events = http.get(f"/v1/containers/{cid}/egress", params={"limit": 100}).json()["data"]
    *refused, ok_curl, ok_sni = results
    for r in refused[:4]:
        assert answer(r["stdout"]).startswith("HTTP/1.1 421 Misdirected Request"), r
        assert "differs from the host it was sent to" in r["stdout"], r
    for r in refused[4:]:
        assert r["stdout"].strip() == "HTTP/1.1 421 Misdirected Request", r
    assert ok_curl["stdout"] == "200", ok_curl
    assert ok_sni["stdout"].strip() == "HTTP/1.1 200 OK", ok_sni
    seen = upstream.seen()
    assert len(seen) == 2, seen  # only the two matching requests
    assert all(s["host"].split(":")[0] == "api.example.test" for s in seen), seen
    assert all(s["sni"] == "api.example.test" for s in seen), seen
    # the upstream never heard the names the sandbox put in its SNI, only the CONNECT hosts
    assert set(upstream.handshakes()) <= {"api.example.test", "other.example.test"}
    reasons = [e["reason"] or "" for e in events if e["status_code"] == 421]
    assert len(reasons) >= 6 and all("differs from the host" in x for x in reasons), events


def test_secrets_are_sent_over_https_only(
    egress: EgressServer, box: tuple[str, str], upstream: Upstream
) -> None:
    """A placeholder in a plain-HTTP request to the secret's domain is refused (403 naming
    https), never replaced by the value; plain HTTP without one still goes through."""
    cid, placeholder = box
    upstream.clear()
    with egress.http as http:
        header, basic, plain = run(
            http,
            cid,
            f'{CURL} -i -H "X-Tok: $API_KEY" http://api.example.test/echo',
            f'{CURL} -i -u "user:$API_KEY" http://api.example.test/echo',
            f"{CURL} -o /dev/null -w '%{{http_code}}' http://api.example.test/echo?plain=1",
        )
        events = http.get(f"/v1/containers/{cid}/egress", params={"limit": 100}).json()["data"]
    for r in (header, basic):
        assert r["stdout"].startswith("HTTP/1.1 403"), r
        assert "only sent over HTTPS; use https://api.example.test/" in r["stdout"], r
    assert plain["stdout"] == "200", plain
    seen = upstream.seen()
    assert [s["path"] for s in seen] == ["/echo?plain=1"], seen
    assert not any(SECRET in str(s) or placeholder in str(s) for s in seen)
    assert sum("only sent over HTTPS" in (e["reason"] or "") for e in events) >= 2, events


# -- at rest ----------------------------------------------------------------------------------


def test_secrets_at_rest_are_sealed_and_for_root_only(
    egress: EgressServer, box: tuple[str, str]
) -> None:
    """A copy of the database (file, WAL, shared memory) holds no value; the database and
    the key that seals the values are root's only; the key is not in the database."""
    cid, _ = box
    with egress.http as http:  # the secret is in use
        [r] = run(http, cid, f'{CURL} -H "X-Tok: $API_KEY" https://api.example.test/echo')
    assert '"x-tok": "shellbox-secret-' in r["stdout"], r
    private = egress.server.state_dir / "private"
    assert private.stat().st_mode & 0o777 == 0o700
    db_files = list(private.glob("shellbox.db*"))
    assert {p.name for p in db_files} >= {"shellbox.db", "shellbox.db-wal"}, db_files
    key = (private / "secrets.key").read_bytes().strip()
    for p in [*db_files, private / "secrets.key"]:
        assert p.stat().st_mode & 0o777 == 0o600, p
    stored = b"".join(p.read_bytes() for p in db_files)
    assert SECRET.encode() not in stored and SECRET.lower().encode() not in stored.lower()
    assert base64.b64encode(SECRET.encode())[:20] not in stored
    assert key not in stored
