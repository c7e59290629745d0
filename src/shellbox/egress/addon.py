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
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

# mitmproxy lives only in .venv-egress; the server's environment (and mypy's) lacks it.
from mitmproxy import ctx, http  # type: ignore[import-not-found]

log = logging.getLogger("shellbox.egress")

POLICY_FILE = "policy.json"  # must match egress/paths.py
AUDIT_FILE = "audit.jsonl"  # must match egress/paths.py
READY_FILE = "ready"  # must match egress/paths.py
ALLOWED_PORTS = (80, 443)
REFUSED_STATUS = 520  # what OpenRouter's sandboxes answer for plain HTTP outside the policy
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


class Scrubber:
    """Replaces secret values by their placeholders in a streamed body, counting its bytes.

    A value cut in two by a chunk boundary is caught by holding back the last
    ``len(longest value) - 1`` bytes until the next chunk (or the end) arrives.
    """

    def __init__(self, secrets: Iterable[Secret], count: Callable[[int], None]) -> None:
        pairs = sorted(((s.value, s.placeholder) for s in secrets), key=lambda p: -len(p[0]))
        self.map = dict(pairs)
        self.pattern = re.compile(b"|".join(re.escape(v) for v, _ in pairs)) if pairs else None
        self.keep = max((len(v) for v, _ in pairs), default=1) - 1
        self.count = count
        self.held = b""

    def __call__(self, chunk: bytes) -> bytes:
        self.count(len(chunk))
        data = self.held + chunk
        if self.pattern is None:
            self.held = b""
            return data
        final = chunk == b""
        cut = len(data) if final else max(len(data) - self.keep, 0)
        out: list[bytes] = []
        pos = 0
        for m in self.pattern.finditer(data):
            if m.start() >= cut:
                break
            out.append(data[pos : m.start()])
            out.append(self.map[m.group()])
            pos = m.end()
        cut = max(cut, pos)
        out.append(data[pos:cut])
        self.held = data[cut:]
        return b"".join(out)


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
            state = FlowState(policy.container)
            flow.metadata[META] = state
            state.secrets = policy.secrets_for(host)
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
            if state.secrets:
                flow.response.headers.fields = tuple(
                    (k, self._scrub(v, state.secrets)) for k, v in flow.response.headers.fields
                )
            if flow.response.stream:

                def count(n: int) -> None:
                    state.response_bytes += n

                flow.response.stream = Scrubber(state.secrets, count)
        except Exception:
            log.exception("shellbox egress: responseheaders failed")
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            state = flow.metadata.get(META)
            if not isinstance(state, FlowState) or state.audited or flow.response is None:
                return
            if not flow.response.stream:
                if state.secrets:
                    body = flow.response.get_content(strict=False) or b""
                    scrubbed = self._scrub(body, state.secrets)
                    if scrubbed != body:
                        flow.response.content = scrubbed
                state.response_bytes = len(flow.response.raw_content or b"")
            if not flow.request.stream:
                state.request_bytes = len(flow.request.raw_content or b"")
            self._audit(flow, state.container, "allowed", None, flow.response.status_code)
            state.audited = True
        except Exception:
            log.exception("shellbox egress: response failed")

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
        """With ``intercept=secrets``, TLS to a host no secret is for is tunnelled as is: much
        faster (no decryption in Python), audited per connection instead of per request."""
        try:
            if self.intercept != "secrets" or data.context.server.address is None:
                return
            policy = self._client(data.context.client)
            host, port = data.context.server.address
            host = _norm(str(host))
            if policy is None or policy.secrets_for(host):
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
    def _scrub(data: bytes, secrets: list[Secret]) -> bytes:
        for s in secrets:
            if s.value in data:
                data = data.replace(s.value, s.placeholder)
        return data

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
