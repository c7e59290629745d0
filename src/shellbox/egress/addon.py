"""The mitmproxy addon of the egress proxy: allowlists, ``domain_secrets`` and the audit.

It runs inside mitmproxy (``proxy_main.py``) in the proxy's own virtual environment
(``.venv-egress``), so it imports nothing from shellbox: only the standard library and
mitmproxy. The server tells it what to do through files in the directory given by the
``shellbox_dir`` option (written atomically by ``egress.service``; the names must match
``egress/paths.py``):

    policy.json   client address -> container, allowlist regexes, secrets (mode 0600)
    audit.jsonl   one JSON line per egress attempt, appended here and ingested by the server
    ready         written once the proxy listens

A container is known by the source address of its connection (each one has its own veth).
Policy is checked at three points: at CONNECT (a refusal the client can read), on every request
header block (plain HTTP gets a 520 naming the policy; the secrets are put in), and when an
upstream connection is about to open (the hard gate, which also refuses addresses on this host
or in the sandbox network). Every hook catches its own errors: an exception must never turn
into an open door or a dead proxy.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import os
import re
import socket
import time
import zlib
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any, NamedTuple

# mitmproxy (and the decoders it depends on) live only in .venv-egress; the server's
# environment (and mypy's) lacks them.
import brotli  # type: ignore[import-not-found]
import zstandard  # type: ignore[import-not-found]
from mitmproxy import ctx, http  # type: ignore[import-not-found]

log = logging.getLogger("shellbox.egress")

POLICY_FILE = "policy.json"  # must match egress/paths.py
AUDIT_FILE = "audit.jsonl"  # must match egress/paths.py
READY_FILE = "ready"  # must match egress/paths.py
ALLOWED_PORTS = (80, 443)
REFUSED_STATUS = 520  # what OpenRouter's sandboxes answer for plain HTTP outside the policy
MISDIRECTED_STATUS = 421  # a Host, :authority or SNI other than the host connected to
CLEARTEXT_STATUS = 403  # a secret's placeholder in a request that is not HTTPS
BAD_GATEWAY = 502
META = "shellbox"  # key in flow.metadata
AUDIT_CHECK_S = 0.5  # how often to look whether the server rotated the audit file


# Plain classes, not dataclasses: mitmproxy loads this file without putting it in
# sys.modules, which dataclasses need to resolve postponed annotations.
class Secret(NamedTuple):
    domain: re.Pattern[str]
    placeholder: bytes
    value: bytes


class ClientPolicy(NamedTuple):
    container: str
    allowed_domains: tuple[str, ...]
    allow: tuple[re.Pattern[str], ...]
    any_host: bool
    secrets: tuple[Secret, ...]

    def allows(self, host: str) -> bool:
        if _is_ip(host):
            return self.any_host
        return any(p.match(host) for p in self.allow)

    def secrets_for(self, host: str) -> list[Secret]:
        chosen: dict[bytes, Secret] = {}
        for s in self.secrets:
            if s.placeholder not in chosen and s.domain.match(host):
                chosen[s.placeholder] = s
        return list(chosen.values())


class FlowState:
    """What the addon keeps per flow, in ``flow.metadata``."""

    def __init__(self, container: str, *, audited: bool = False) -> None:
        self.container = container
        self.audited = audited
        self.secrets: list[Secret] = []
        self.request_bytes = 0
        self.response_bytes = 0


def _is_ip(host: str) -> bool:
    if ":" not in host and not host.rpartition(".")[2].isdigit():
        return False  # the common case, without ipaddress's exception
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _norm(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def _client_ip(conn: Any) -> str:
    peer = getattr(conn, "peername", None)
    ip = str(peer[0]) if peer else ""
    return ip[7:] if ip.startswith("::ffff:") else ip


def parse_hosts(text: str) -> dict[str, str]:
    """Hosts-file format: ``ADDRESS NAME [NAME...]``, ``#`` comments; first mapping wins."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) < 2 or not _is_ip(words[0]):
            continue
        for name in words[1:]:
            out.setdefault(_norm(name), words[0])
    return out


# -- what the sandbox must never read back ---------------------------------------------------
#
# The proxy puts a secret's value into requests; an upstream may send it back in any form (an
# echo, a debug page, an error message). Every form the proxy itself produces (the raw value,
# the value inside a Basic credential's base64) and every trivially reversible form of it is
# found in what comes back (headers, bodies, trailers, WebSocket messages) and replaced by the
# placeholder, whatever the case of its letters:
#   - the value with any of its characters escaped: %XX (URL encoding, '+' for a space),
#     \xXX, \u00XX, a backslash before punctuation (JSON, shells), HTML entities;
#   - hex of the value;
#   - base64 (standard and URL-safe alphabets, padded or not, wrapped in lines or not) of any
#     data containing the value, at each of the three alignments it may have inside it: the
#     characters that carry only the value's bits, plus the one on either side that carries
#     some of them, so that no bit of the value is left.
# Replacing rather than refusing the response: a streamed body's headers are already on their
# way when a copy turns up in it, and an answer that merely echoes a credential (a token
# introspection, an echo service) stays usable. The placeholder is put in the encoded form's
# place as is: the bits the form shared with its neighbours cannot be rebuilt without the value.

MIN_ENCODED = 8  # an encoded form shorter than this would match unrelated text too often
_B64_CHARS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_")
_LINE_BREAK = rb"(?:\r?\n)?"  # MIME base64 is wrapped in 76-character lines
_HTML_NAMED = {
    ord("&"): [b"&amp;"],
    ord("<"): [b"&lt;"],
    ord(">"): [b"&gt;"],
    ord('"'): [b"&quot;"],
    ord("'"): [b"&apos;"],
}


def _char_forms(c: int) -> bytes:
    """A regular expression for one character of a value, escaped or not."""
    h, hx = b"%02x" % c, b"%x" % c
    forms = [
        re.escape(bytes([c])),
        b"%" + h,
        rb"\\x" + h,
        rb"\\u00" + h,
        b"&#0{0,4}%d;" % c,
        b"&#x0{0,4}" + hx + b";",
        *_HTML_NAMED.get(c, []),
    ]
    if not bytes([c]).isalnum():
        forms.append(rb"\\" + re.escape(bytes([c])))
    if c == 0x20:
        forms.append(rb"\+")
    return b"(?:" + b"|".join(forms) + b")"


def b64_cores(value: bytes) -> list[bytes]:
    """The base64 characters made of the value's bits only, at each alignment."""
    out = []
    for align in range(3):
        first, stop = -(-8 * align // 6), 8 * (align + len(value)) // 6
        if stop - first >= MIN_ENCODED:
            out.append(base64.b64encode(b"\0" * align + value + b"\0\0")[first:stop])
    return out


def _b64_units(value: bytes) -> list[list[bytes]]:
    """The value inside base64 text, at each of its alignments: the characters made of the
    value's bits only, then the one that carries its last bits (each may follow a line
    break). The one before, which carries its first bits, is added to the span by
    ``find_forms`` (a pattern that starts with a class of characters is searched far slower)."""
    out: list[list[bytes]] = []
    n = len(value)
    for align in range(3):
        start, end = 8 * align, 8 * (align + n)  # the value's bits in the encoded stream
        first, stop = -(-start // 6), end // 6  # characters made of its bits only
        if stop - first < MIN_ENCODED:
            continue
        base = base64.b64encode(b"\0" * align + value + b"\0\0")
        units = [_b64_class({c}) for c in base[first:stop]]
        if end % 6:  # its character depends on the value's last bytes and the next one only
            k = min(n, 3)
            tail_align = (align + n - k) % 3
            tail_stop = 8 * (tail_align + k) // 6
            trail = {
                base64.b64encode(b"\0" * tail_align + value[-k:] + bytes([y]) + b"\0")[tail_stop]
                for y in range(256)
            }
            units.append(_b64_class(trail))
        out.append([units[0], *(_LINE_BREAK + u for u in units[1:])])
    return out


def _b64_class(chars: set[int]) -> bytes:
    """Characters of the standard alphabet, and their URL-safe twins."""
    alts = set(chars)
    alts |= {ord("-") for c in chars if c == ord("+")} | {ord("_") for c in chars if c == ord("/")}
    if len(alts) == 1:
        return re.escape(bytes(alts))
    return b"[" + b"".join(re.escape(bytes([c])) for c in sorted(alts)) + b"]"


def value_forms(value: bytes) -> tuple[list[tuple[list[bytes], bool]], int]:
    """Every form of ``value`` to scrub, each a list of regular expressions, one per unit of
    the form (a character of the value, of its hex, of its base64), lowercase since they are
    matched against lowercased text, with whether it is a base64 form; and the longest text
    a form can match."""
    forms = [([_char_forms(c) for c in value], False)]
    if 2 * len(value) >= MIN_ENCODED:
        forms.append(([re.escape(b"%02x" % c) for c in value], False))
    longest = 10 * len(value)  # '&#x0000NN;' per character
    b64 = _b64_units(value)
    forms += [(units, True) for units in b64]
    if b64:
        longest = max(longest, 3 * (len(value) * 4 // 3 + 4))  # each character, and CR LF
    return [([u.lower() for u in units], is_b64) for units, is_b64 in forms], longest + LEAD


LEAD = 3  # a base64 form's span also takes the character before it (and a line break)
# A form is searched with one regular expression for its first DETECT units, then followed
# unit by unit: compiling one expression for a whole long value (8 KiB are allowed) takes
# seconds of the proxy's only thread, and that per value.
DETECT = 24


class Form(NamedTuple):
    detector: re.Pattern[bytes]
    rest: tuple[re.Pattern[bytes], ...]
    b64: bool


_UNITS: dict[bytes, re.Pattern[bytes]] = {}  # few: one per character and class
_FORMS: dict[bytes, tuple[list[Form], int]] = {}
Forms = tuple[list[tuple[Form, int]], int]


def _unit(source: bytes) -> re.Pattern[bytes]:
    found = _UNITS.get(source)
    if found is None:
        found = _UNITS[source] = re.compile(source)
    return found


def scrub_forms(secrets: list[Secret]) -> Forms:
    """(form, index of its secret) for every form of every value, and the longest span;
    each value's forms are compiled once. Each detector is searched separately: an
    alternation of them would defeat the regex engine's first-character scan (measured:
    5 MB/s instead of 80 and more)."""
    out: list[tuple[Form, int]] = []
    longest = 1
    for i, s in enumerate(secrets):
        found = _FORMS.get(s.value)
        if found is None:
            if len(_FORMS) > 4096:  # containers come and go: forget the old values
                _FORMS.clear()
            forms, n = value_forms(s.value)
            # what the proxy itself sends may be the value's base64 (a Basic credential),
            # which an upstream may then encode again
            for core in b64_cores(s.value):
                more, m = value_forms(core)
                forms += more
                n = max(n, m)
            compiled = [
                Form(re.compile(b"".join(units[:DETECT])), tuple(map(_unit, units[DETECT:])), b64)
                for units, b64 in forms
            ]
            found = _FORMS[s.value] = (compiled, n)
        out += [(form, i) for form in found[0]]
        longest = max(longest, found[1])
    return out, longest


def find_forms(data: bytes, forms: Forms) -> list[tuple[int, int, int]]:
    """(start, end, secret index) of every span of ``data`` that holds a form of a value (or
    of its beginning: a value cut short is scrubbed as far as it goes); overlapping spans
    are merged into one, so no piece of a form is left."""
    lowered = data.lower()  # ASCII only: every offset stays the same
    found = []
    for form, i in forms[0]:
        for m in form.detector.finditer(lowered):
            end = m.end()
            for unit in form.rest:
                more = unit.match(lowered, end)
                if more is None:
                    break
                end = more.end()
            found.append((_lead(data, m.start()) if form.b64 else m.start(), end, i))
    found.sort()
    spans: list[tuple[int, int, int]] = []
    for start, end, i in found:
        if spans and start < spans[-1][1]:
            last = spans[-1]
            spans[-1] = (last[0], max(last[1], end), last[2])
        else:
            spans.append((start, end, i))
    return spans


def _lead(data: bytes, start: int) -> int:
    """Where a base64 form found at ``start`` begins, with the character before it."""
    if data[max(start - 2, 0) : start] == b"\r\n":
        start -= 2
    elif data[start - 1 : start] == b"\n":
        start -= 1
    if start > 0 and data[start - 1] in _B64_CHARS:
        start -= 1
    return start


def scrub(data: bytes, secrets: list[Secret]) -> bytes:
    """``data`` with every form of every value replaced by its placeholder."""
    if not secrets or not data:
        return data
    out: list[bytes] = []
    pos = 0
    for start, end, i in find_forms(data, scrub_forms(secrets)):
        out += [data[pos:start], secrets[i].placeholder]
        pos = end
    out.append(data[pos:])
    return b"".join(out)


class _Inflate:
    """gzip, or deflate: zlib-wrapped by the standard, raw from some servers (the first two
    bytes tell)."""

    def __init__(self, *, gzip: bool) -> None:
        self.gzip = gzip
        self.d: Any = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None

    def __call__(self, chunk: bytes) -> bytes:
        if self.d is None:
            if not chunk:
                return b""
            is_zlib = len(chunk) >= 2 and (chunk[0] * 256 + chunk[1]) % 31 == 0
            self.d = zlib.decompressobj(zlib.MAX_WBITS if is_zlib else -zlib.MAX_WBITS)
        return bytes(self.d.decompress(chunk) if chunk else self.d.flush())


def stream_decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    """A function that decodes a body chunk by chunk (``b""`` at its end flushes), or None
    for an encoding the proxy cannot decode (or a list of several)."""
    if encoding in ("gzip", "x-gzip", "deflate"):
        return _Inflate(gzip=encoding != "deflate")
    if encoding == "br":
        brotli_d = brotli.Decompressor()
        return lambda chunk: brotli_d.process(chunk) if chunk else b""
    if encoding == "zstd":
        zstd_d = zstandard.ZstdDecompressor().decompressobj()
        return lambda chunk: zstd_d.decompress(chunk) if chunk else b""
    return None


class Scrubber:
    """Replaces secret values by their placeholders in a streamed body, counting its bytes.

    A value cut in two by a chunk boundary is caught by holding back the last
    ``longest match - 1`` bytes until the next chunk (or the end) arrives: a form that
    starts before the held part is then whole in what was searched.
    """

    def __init__(
        self,
        secrets: Iterable[Secret],
        count: Callable[[int], None],
        decode: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.decode = decode
        self.secrets = list(secrets)
        self.forms = scrub_forms(self.secrets)
        self.keep = self.forms[1] - 1
        self.count = count
        self.held = b""

    def __call__(self, chunk: bytes) -> list[bytes]:
        """What to send on: a list, empty while everything is held back (mitmproxy would send
        an empty bytes chunk, which ends a chunked body)."""
        self.count(len(chunk))
        final = chunk == b""
        if self.decode is not None:
            chunk = self.decode(chunk)
        data = self.held + chunk
        if not self.secrets:
            self.held = b""
            return [data] if data else []
        if not final and len(data) < 2 * self.keep:
            # too little new data past what must be held back: wait for more, so that each
            # byte is searched at most about twice (the held part is searched again)
            self.held = data
            return []
        cut = len(data) if final else len(data) - self.keep
        out: list[bytes] = []
        pos = 0
        for start, end, i in find_forms(data, self.forms):
            if start >= cut:
                break
            out += [data[pos:start], self.secrets[i].placeholder]
            pos = end
        cut = max(cut, pos)
        out.append(data[pos:cut])
        self.held = data[cut:]
        sent = b"".join(out)
        return [sent] if sent else []


class EgressAddon:
    def __init__(self) -> None:
        self.dir = ""
        self.hosts_file = ""
        self.intercept = "all"
        self._policy_key: tuple[int, int, int] | None = None
        self._clients: dict[str, ClientPolicy] = {}
        self._blocked_nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self._hosts_key: tuple[int, int, int] | None = None
        self._hosts: dict[str, str] = {}
        self._audit_fd: int | None = None
        self._audit_ino = 0
        self._audit_checked = 0.0

    # -- mitmproxy lifecycle ----------------------------------------------------------------

    def load(self, loader: Any) -> None:
        loader.add_option("shellbox_dir", str, "", "directory shared with the shellbox server")
        loader.add_option("shellbox_hosts_file", str, "", "hosts-file overrides for upstreams")
        loader.add_option(
            "shellbox_intercept", str, "all", "'all', or 'secrets': tunnel the other hosts"
        )

    def configure(self, updated: set[str]) -> None:
        if "shellbox_dir" in updated:
            self.dir = ctx.options.shellbox_dir
        if "shellbox_intercept" in updated:
            self.intercept = ctx.options.shellbox_intercept
        if "shellbox_hosts_file" in updated:
            self.hosts_file = ctx.options.shellbox_hosts_file
            self._hosts_key = None

    def running(self) -> None:
        try:
            # mitmproxy has no name-resolution hook: wrap the loop's getaddrinfo, the one
            # place every upstream connection resolves its host, so that the hosts-file
            # overrides apply and no name can lead to this host or to another sandbox.
            loop = asyncio.get_running_loop()
            original = loop.getaddrinfo
            resolver = self._make_resolver(original)
            loop.getaddrinfo = resolver  # type: ignore[method-assign]
            self._write_ready()
        except Exception:
            log.exception("shellbox egress: start-up failed")

    def done(self) -> None:
        if self._audit_fd is not None:
            os.close(self._audit_fd)
            self._audit_fd = None

    # -- policy state -----------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def _refresh(self) -> None:
        """Re-read policy.json when it changed (it is replaced by rename: a new inode)."""
        try:
            st = os.stat(self._path(POLICY_FILE))
        except FileNotFoundError:
            self._clients, self._policy_key = {}, None
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self._policy_key:
            return
        with open(self._path(POLICY_FILE), "rb") as f:
            raw = json.load(f)
        clients: dict[str, ClientPolicy] = {}
        for addr, c in raw.get("clients", {}).items():
            clients[addr] = ClientPolicy(
                container=c["container"],
                allowed_domains=tuple(c["allowed_domains"]),
                allow=tuple(re.compile(r) for r in c["allow"]),
                any_host="*" in c["allowed_domains"],
                secrets=tuple(
                    Secret(re.compile(s["domain"]), s["placeholder"].encode(), s["value"].encode())
                    for s in c.get("secrets", [])
                ),
            )
        self._clients = clients
        self._blocked_nets = [ipaddress.ip_network(n) for n in raw.get("blocked_networks", [])]
        self._policy_key = key

    def _client(self, conn: Any) -> ClientPolicy | None:
        self._refresh()
        return self._clients.get(_client_ip(conn))

    def _refresh_hosts(self) -> None:
        if not self.hosts_file:
            self._hosts = {}
            return
        try:
            st = os.stat(self.hosts_file)
        except FileNotFoundError:
            self._hosts, self._hosts_key = {}, None
            return
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._hosts_key:
            with open(self.hosts_file, encoding="utf-8", errors="replace") as f:
                self._hosts = parse_hosts(f.read())
            self._hosts_key = key

    # -- decisions --------------------------------------------------------------------------

    @staticmethod
    def refusal(policy: ClientPolicy | None, host: str, port: int) -> str | None:
        """Why a request to host:port is refused, or None when the policy allows it."""
        if policy is None:
            return (
                "shellbox egress: this connection does not come from a sandbox with an "
                "allowlist network_policy"
            )
        if port not in ALLOWED_PORTS:
            return (
                f"shellbox egress: port {port} is refused: the container's network_policy "
                "allows only ports 80 and 443"
            )
        if not policy.allows(host):
            if _is_ip(host):
                return (
                    f"shellbox egress: {host} is refused: the container's network_policy "
                    "allows hostnames, not IP addresses"
                )
            return (
                f"shellbox egress: host {host!r} is not in the container's network_policy "
                f"allowlist ({', '.join(policy.allowed_domains)})"
            )
        return None

    def _blocked_address(self, ip_text: str) -> str | None:
        """Why the proxy must not connect to this address: this host, or a sandbox."""
        ip = ipaddress.ip_address(ip_text.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
            return f"{ip} is a loopback, link-local, multicast or unspecified address"
        if any(ip in net for net in self._blocked_nets):
            return f"{ip} is in the sandbox network"
        # An address this host owns (whatever interface): binding to it succeeds.
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((str(ip), 0))
            except OSError:
                return None
        return f"{ip} is an address of the proxy's own host"

    def _make_resolver(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def getaddrinfo(
            host: Any, port: Any, *, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
        ) -> list[Any]:
            name = _norm(host.decode() if isinstance(host, bytes) else str(host or ""))
            self._refresh_hosts()
            infos: list[Any]
            if name in self._hosts:
                ip = self._hosts[name]
                fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
                if family not in (0, fam):
                    msg = f"{name} is mapped to {ip}, which is not of the requested family"
                    raise socket.gaierror(socket.EAI_FAMILY, msg)
                sockaddr: tuple[Any, ...] = (ip, int(port or 0))
                if fam == socket.AF_INET6:
                    sockaddr = (ip, int(port or 0), 0, 0)
                infos = [(fam, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)]
            else:
                infos = await original(
                    host, port, family=family, type=type, proto=proto, flags=flags
                )
            ok = [i for i in infos if self._blocked_address(i[4][0]) is None]
            if not ok:
                reasons = sorted({str(self._blocked_address(i[4][0])) for i in infos})
                msg = f"{name} resolves only to refused addresses ({'; '.join(reasons)})"
                raise OSError(msg)
            return ok

        return getaddrinfo

    # -- hooks ------------------------------------------------------------------------------

    def http_connect(self, flow: http.HTTPFlow) -> None:
        try:
            policy = self._client(flow.client_conn)
            host, port = _norm(flow.request.host), int(flow.request.port)
            reason = self.refusal(policy, host, port)
            if reason is not None:
                self._refuse(flow, policy, 403, reason)
        except Exception:
            log.exception("shellbox egress: http_connect failed; refusing")
            self._refuse(flow, None, 403, "shellbox egress: internal error")

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            policy = self._client(flow.client_conn)
            host, port = _norm(flow.request.host), int(flow.request.port)
            reason = self.refusal(policy, host, port)
            if reason is not None:
                self._refuse(flow, policy, REFUSED_STATUS, reason)
                return
            assert policy is not None
            # The policy and the secrets follow the host the proxy connects to (the CONNECT
            # target, or the absolute URI's host): a different Host, :authority or SNI
            # would let a CDN deliver the request (and its secrets) to another site.
            reason = misdirected(flow, host, port)
            if reason is not None:
                self._refuse(flow, policy, MISDIRECTED_STATUS, reason)
                return
            state = FlowState(policy.container)
            flow.metadata[META] = state
            secrets = policy.secrets_for(host)
            if secrets and flow.request.scheme != "https":
                # never a secret in clear text; a placeholder sent anyway is refused, so the
                # client learns why the upstream did not accept its credential
                if _carries_placeholder(flow.request.headers.fields, secrets):
                    reason = (
                        f"shellbox egress: the domain_secrets for {host} are only sent over "
                        f"HTTPS; use https://{host}/ instead of http://"
                    )
                    self._refuse(flow, policy, CLEARTEXT_STATUS, reason)
                    return
                secrets = []
            state.secrets = secrets
            if state.secrets:
                self._inject(flow, state.secrets)
            if flow.request.stream:
                flow.request.stream = self._counter(state, "request_bytes")
        except Exception:
            log.exception("shellbox egress: requestheaders failed; refusing")
            self._refuse(flow, None, REFUSED_STATUS, "shellbox egress: internal error")

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            state = flow.metadata.get(META)
            if not isinstance(state, FlowState) or state.audited or flow.response is None:
                return

            def count(n: int) -> None:
                state.response_bytes += n

            if not state.secrets:
                if flow.response.stream:
                    flow.response.stream = Scrubber([], count)
                return
            response = flow.response
            self._scrub_head(response, state.secrets)
            if flow.request.method == "HEAD" or response.status_code in (204, 304):
                return  # no body
            if response.status_code < 200:
                return  # 101: a WebSocket's messages are scrubbed one by one
            # Every body is streamed through the scrubber, whatever its size: mitmproxy turns
            # a buffered body into a stream (unscrubbed) when it grows past its streaming
            # size. A compressed one is decoded on the way (the value would hide in it).
            encoding = response.headers.get("content-encoding", "").strip().lower()
            decoder = None
            if encoding not in ("", "identity"):
                decoder = stream_decoder(encoding)
                if decoder is None:
                    reason = (
                        "shellbox egress: the upstream's answer to a request that carried a "
                        f"domain_secret is encoded ({encoding}) in a way the proxy cannot "
                        "read, so it cannot be checked for the secret"
                    )
                    self._audit(flow, state.container, "refused", reason, BAD_GATEWAY)
                    state.audited = True
                    flow.kill()
                    return
                del response.headers["content-encoding"]
            # scrubbing changes the body's length: frame it by chunks (HTTP/2 frames it)
            response.headers.pop("content-length", None)
            if flow.request.http_version == "HTTP/1.1":
                response.headers["transfer-encoding"] = "chunked"
            response.stream = Scrubber(state.secrets, count, decoder)
        except Exception:
            log.exception("shellbox egress: responseheaders failed")
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            state = flow.metadata.get(META)
            if not isinstance(state, FlowState) or state.audited or flow.response is None:
                return
            if state.secrets and flow.response.trailers:
                flow.response.trailers.fields = _scrub_fields(
                    flow.response.trailers.fields, state.secrets
                )
            if not flow.response.stream:  # (a flow with secrets is always streamed)
                state.response_bytes = len(flow.response.raw_content or b"")
            if not flow.request.stream:
                state.request_bytes = len(flow.request.raw_content or b"")
            self._audit(flow, state.container, "allowed", None, flow.response.status_code)
            state.audited = True
        except Exception:
            log.exception("shellbox egress: response failed")
            flow.kill()

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """A WebSocket opened with a secret in its handshake: the upstream's messages are
        scrubbed like a body (each message is whole here)."""
        try:
            state = flow.metadata.get(META)
            if not isinstance(state, FlowState) or not state.secrets or flow.websocket is None:
                return
            message = flow.websocket.messages[-1]
            if not message.from_client:
                message.content = scrub(message.content, state.secrets)
        except Exception:
            log.exception("shellbox egress: websocket_message failed")
            flow.kill()

    def error(self, flow: http.HTTPFlow) -> None:
        try:
            state = flow.metadata.get(META)
            if not isinstance(state, FlowState) or state.audited:
                return
            status = flow.response.status_code if flow.response is not None else None
            reason = flow.error.msg if flow.error is not None else "error"
            self._audit(flow, state.container, "allowed", reason, status)
            state.audited = True
        except Exception:
            log.exception("shellbox egress: error hook failed")

    async def server_connect(self, data: Any) -> None:
        """The hard gate: every upstream connection must be allowed for its client."""
        try:
            policy = self._client(data.client)
            host, port = data.server.address
            host = _norm(str(host))
            reason = self.refusal(policy, host, int(port))
            if reason is None and _is_ip(host):
                reason = self._blocked_address(host)
            if reason is not None:
                data.server.error = reason
        except Exception:
            log.exception("shellbox egress: server_connect failed; refusing")
            data.server.error = "shellbox egress: internal error"

    def tls_clienthello(self, data: Any) -> None:
        """The upstream always gets the CONNECT host as its SNI, never the one the sandbox
        chose (a request with a different SNI is refused at its headers, see
        ``misdirected``). With ``intercept=secrets``, TLS to a host no secret is for is
        tunnelled as is: much faster (no decryption in Python), audited per connection
        instead of per request; unless its SNI names another host, which only an
        intercepted connection can refuse."""
        try:
            if data.context.server.address is None:
                return
            host, port = data.context.server.address
            host = _norm(str(host))
            data.context.server.sni = host
            if self.intercept != "secrets":
                return
            policy = self._client(data.context.client)
            if policy is None or policy.secrets_for(host):
                return
            sni = data.client_hello.sni
            if sni is not None and _norm(sni) != host:
                return
            data.ignore_connection = True
            self._write_audit(
                {
                    "container": policy.container,
                    "method": "CONNECT",
                    "scheme": "https",
                    "host": host,
                    "port": int(port),
                    "path": "",
                    "decision": "allowed",
                    "reason": "tunnelled without interception (egress.intercept = secrets)",
                    "status": 200,
                    "request_bytes": 0,
                    "response_bytes": 0,
                }
            )
        except Exception:
            log.exception("shellbox egress: tls_clienthello failed")

    def tls_failed_client(self, data: Any) -> None:
        self._tls_failed(data, "the sandbox's TLS client refused the proxy's certificate")

    def tls_failed_server(self, data: Any) -> None:
        self._tls_failed(data, "upstream TLS failed")

    # -- helpers ----------------------------------------------------------------------------

    def _tls_failed(self, data: Any, what: str) -> None:
        try:
            policy = self._client(data.context.client)
            if policy is None or data.context.server.address is None:
                return
            host, port = data.context.server.address
            error = getattr(data.conn, "error", None) or ""
            self._write_audit(
                {
                    "container": policy.container,
                    "method": "CONNECT",
                    "scheme": "https",
                    "host": _norm(str(host)),
                    "port": int(port),
                    "path": "",
                    "decision": "allowed",
                    "reason": f"{what}: {error}"[:500],
                    "status": None,
                    "request_bytes": 0,
                    "response_bytes": 0,
                }
            )
        except Exception:
            log.exception("shellbox egress: tls hook failed")

    def _refuse(
        self, flow: http.HTTPFlow, policy: ClientPolicy | None, status: int, reason: str
    ) -> None:
        flow.request.stream = False  # a response and a streamed request body cannot mix
        flow.response = http.Response.make(
            status,
            reason + "\n",
            {"content-type": "text/plain; charset=utf-8", "x-shellbox-egress": "refused"},
        )
        if not flow.response.reason and status in HTTPStatus._value2member_map_:
            flow.response.reason = HTTPStatus(status).phrase
        flow.metadata[META] = FlowState(policy.container if policy else "", audited=True)
        if policy is not None:
            self._audit(flow, policy.container, "refused", reason, status)

    @staticmethod
    def _inject(flow: http.HTTPFlow, secrets: list[Secret]) -> None:
        fields = []
        for name, value in flow.request.headers.fields:
            fields.append((name, _replace_secret(value, secrets)))
        flow.request.headers.fields = tuple(fields)
        # An upstream that echoes the request must answer in clear text, so that the
        # response scrubber can put the placeholders back before the sandbox reads it.
        flow.request.headers.pop("accept-encoding", None)

    @staticmethod
    def _scrub_head(response: http.Response, secrets: list[Secret]) -> None:
        response.headers.fields = _scrub_fields(response.headers.fields, secrets)
        reason = response.data.reason
        if reason:
            response.data.reason = scrub(reason, secrets)

    @staticmethod
    def _counter(state: FlowState, attr: str) -> Callable[[bytes], bytes]:
        def count(chunk: bytes) -> bytes:
            setattr(state, attr, getattr(state, attr) + len(chunk))
            return chunk

        return count

    def _audit(
        self,
        flow: http.HTTPFlow,
        container: str,
        decision: str,
        reason: str | None,
        status: int | None,
    ) -> None:
        req = flow.request
        state = flow.metadata.get(META)
        connect = req.method == "CONNECT"
        self._write_audit(
            {
                "container": container,
                "method": req.method,
                "scheme": "https" if connect else req.scheme,
                "host": _norm(req.host),
                "port": int(req.port),
                # never the query string: it may carry tokens
                "path": "" if connect else req.path.split("?", 1)[0][:2048],
                "decision": decision,
                "reason": reason,
                "status": status,
                "request_bytes": state.request_bytes if isinstance(state, FlowState) else 0,
                "response_bytes": state.response_bytes if isinstance(state, FlowState) else 0,
            }
        )

    def _write_audit(self, record: dict[str, Any]) -> None:
        """Append one line; reopen when the server rotated the file away."""
        record["time"] = time.time()
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        path = self._path(AUDIT_FILE)
        now = time.monotonic()
        ino = self._audit_ino
        if now >= self._audit_checked + AUDIT_CHECK_S:  # rotated away by the server?
            self._audit_checked = now
            try:
                ino = os.stat(path).st_ino
            except FileNotFoundError:
                ino = -1
        if self._audit_fd is None or ino != self._audit_ino:
            if self._audit_fd is not None:
                os.close(self._audit_fd)
            self._audit_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._audit_ino = os.fstat(self._audit_fd).st_ino
        os.write(self._audit_fd, line)

    def _write_ready(self) -> None:
        tmp = self._path(READY_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, self._path(READY_FILE))


def misdirected(flow: http.HTTPFlow, host: str, port: int) -> str | None:
    """Why the request names another host than the one the proxy connects to, or None."""
    req = flow.request
    named = [("Host", v) for v in req.headers.get_all("host")]
    if req.authority:
        named.append((":authority", req.authority))
    client = flow.client_conn
    if getattr(client, "tls", False) and client.sni:
        named.append(("TLS SNI", client.sni))
    for what, value in named:
        other_host, other_port = _split_authority(value)
        if other_host != host or other_port not in (None, port):
            return (
                f"shellbox egress: the request's {what} {value!r} differs from the host it "
                f"was sent to ({host}:{port}); send it to that host (one host per connection)"
            )
    return None


def _split_authority(value: str) -> tuple[str, int | None]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (normalized host, port or None)."""
    value = value.strip()
    host, port = value, ""
    if value.startswith("["):
        end = value.find("]")
        host, port = value[: end + 1], value[end + 1 :].removeprefix(":")
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    try:
        return _norm(host), int(port) if port else None
    except ValueError:
        return _norm(value), -1  # never equal to a real port


def _carries_placeholder(fields: Iterable[tuple[bytes, bytes]], secrets: list[Secret]) -> bool:
    return any(_replace_secret(v, secrets) != v for _, v in fields)


def _scrub_fields(
    fields: Iterable[tuple[bytes, bytes]], secrets: list[Secret]
) -> tuple[tuple[bytes, bytes], ...]:
    """Header (or trailer) fields with the values scrubbed from names and values alike."""
    return tuple((scrub(k, secrets), scrub(v, secrets)) for k, v in fields)


def _replace_secret(value: bytes, secrets: list[Secret]) -> bytes:
    for s in secrets:
        value = value.replace(s.placeholder, s.value)
    # ``curl -u user:$TOKEN`` hides the placeholder in a Basic credential: open it up.
    if value[:6].lower() == b"basic ":
        try:
            decoded = base64.b64decode(value[6:].strip(), validate=True)
        except ValueError:
            return value
        replaced = decoded
        for s in secrets:
            replaced = replaced.replace(s.placeholder, s.value)
        if replaced != decoded:
            value = value[:6] + base64.b64encode(replaced)
    return value


addons = [EgressAddon()]
