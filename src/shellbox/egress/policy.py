"""Network policies: validation of ``allowed_domains`` / ``domain_secrets`` and glob matching.

Pure functions, no I/O. The rules are OpenRouter's and OpenAI's: 1 to 50 entries, each a
lowercase hostname or glob (no scheme, path, port or IP address); ``*`` matches any run of
characters, dots included (``*.example.com``, ``google.*.com``); an exact name does not cover
its subdomains; ``["*"]`` means any host.

Globs are shipped to the proxy as regular expressions (``glob_regex``) so that the mitmproxy
addon, which runs in its own virtual environment, needs nothing from this package.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shellbox.errors import InvalidRequest

MAX_DOMAINS = 50
MAX_SECRETS = 50
MAX_SECRET_VALUE = 8192
MAX_NAME = 128
_LABEL = re.compile(r"^[a-z0-9*]([a-z0-9*-]*[a-z0-9*])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Secret values go into HTTP header values: printable ASCII and spaces only, so a value can
# never split a header (CR/LF) or be mangled by an encoding.
_HEADER_SAFE = re.compile(r"^[\x20-\x7e]+$")
# Names the sandbox's environment already uses for the proxy, its CA and the shell itself.
RESERVED_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "SHELL", "TERM", "PWD",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
        "http_proxy", "https_proxy", "no_proxy", "all_proxy",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT",
        "NODE_EXTRA_CA_CERTS", "NODE_OPTIONS", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
        "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONDONTWRITEBYTECODE",
    }
)  # fmt: skip


@dataclass(frozen=True)
class DomainSecret:
    domain: str  # a hostname or glob covered by the allowlist
    name: str  # the environment variable that holds the placeholder
    value: str


@dataclass(frozen=True)
class AllowlistPolicy:
    allowed_domains: tuple[str, ...]
    secrets: tuple[DomainSecret, ...] = ()

    def public(self) -> dict[str, Any]:
        """What the API may show: never the secrets."""
        return {"type": "allowlist", "allowed_domains": list(self.allowed_domains)}


# -- matching ------------------------------------------------------------------------------


def glob_regex(pattern: str) -> str:
    """The anchored regular expression for a glob: ``*`` is any run of characters."""
    return "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"


def matches(pattern: str, host: str) -> bool:
    return re.fullmatch(glob_regex(pattern), host) is not None


def allows(patterns: Iterable[str], host: str) -> bool:
    host = normalize_host(host)
    if is_ip_literal(host):
        # IP addresses are never entries; only the "any host" policy reaches one.
        return "*" in patterns
    return any(matches(p, host) for p in patterns)


def covers(outer: str, inner: str) -> bool:
    """Whether every host ``inner`` (a name or glob) matches is also matched by ``outer``.

    Exact for ``*``-only globs: give each ``*`` of ``inner`` a character no literal of
    ``outer`` can match, so that only a ``*`` of ``outer`` can absorb it.
    """
    return re.fullmatch(glob_regex(outer), inner.replace("*", "\x00"), re.DOTALL) is not None


def normalize_host(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- validation ----------------------------------------------------------------------------


def entry_problem(entry: object) -> str | None:
    """Why ``entry`` is not a valid allowlist entry, or None when it is."""
    if not isinstance(entry, str) or not entry:
        return "must be a non-empty string"
    if entry != entry.strip():
        return "must not contain spaces"
    if "://" in entry:
        return "must be a hostname or glob without a scheme (drop the 'https://')"
    if "/" in entry:
        return "must be a hostname or glob without a path"
    if is_ip_literal(entry.strip("[]")) or (":" in entry and entry.count(":") > 1):
        return "must be a hostname, not an IP address"
    if ":" in entry:
        return "must be a hostname or glob without a port (only 80 and 443 are reachable)"
    if entry != entry.lower():
        return "must be lowercase"
    if not entry.isascii():
        return "must be ASCII (write internationalized names in punycode, 'xn--...')"
    if entry == "*":
        return None
    if len(entry) > 253:
        return "is longer than 253 characters"
    labels = entry.split(".")
    for label in labels:
        if not label:
            return "has an empty label (two dots in a row, or a leading or trailing dot)"
        if len(label) > 63:
            return "has a label longer than 63 characters"
        if not _LABEL.match(label):
            return (
                "may contain only a-z, 0-9, '-', '.' and '*' "
                "(and no label may start or end with '-')"
            )
    if all(label.replace("*", "").isdigit() or label == "*" for label in labels):
        return "must be a hostname, not an IP address"
    return None


def validate_allowlist(
    domains: object, *, operator: Sequence[str] | None = None, param: str = "allowed_domains"
) -> tuple[str, ...]:
    """Check a container's ``allowed_domains`` (and that the operator's bound covers each);
    the 400 names the first bad entry."""
    if not isinstance(domains, list):
        msg = (
            f"{param} is required for an allowlist policy: a list of 1 to {MAX_DOMAINS} "
            'hostnames or globs (use ["*"] for any host)'
        )
        raise InvalidRequest(msg, param=param)
    if not 1 <= len(domains) <= MAX_DOMAINS:
        msg = (
            f"{param} must have 1 to {MAX_DOMAINS} entries, got {len(domains)} "
            '(use ["*"] for any host)'
        )
        raise InvalidRequest(msg, param=param)
    out: list[str] = []
    for i, entry in enumerate(domains):
        problem = entry_problem(entry)
        if problem is not None:
            msg = f"{param}[{i}] {entry!r} {problem}"
            raise InvalidRequest(msg, param=f"{param}[{i}]")
        assert isinstance(entry, str)
        if operator is not None and not any(covers(o, entry) for o in operator):
            msg = (
                f"{param}[{i}] {entry!r} is outside this server's egress allowlist "
                f"({', '.join(operator)}); ask the operator or choose a domain inside it"
            )
            raise InvalidRequest(msg, param=f"{param}[{i}]")
        if entry not in out:
            out.append(entry)
    return tuple(out)


def validate_secrets(
    secrets: object, allowed: Sequence[str], *, param: str = "domain_secrets"
) -> tuple[DomainSecret, ...]:
    """Check ``domain_secrets``; messages never quote a value."""
    if secrets is None:
        return ()
    if not isinstance(secrets, list):
        msg = f"{param} must be a list of {{domain, name, value}} objects"
        raise InvalidRequest(msg, param=param)
    if len(secrets) > MAX_SECRETS:
        msg = f"{param} may have at most {MAX_SECRETS} entries, got {len(secrets)}"
        raise InvalidRequest(msg, param=param)
    out: list[DomainSecret] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(secrets):
        where = f"{param}[{i}]"
        if not isinstance(raw, Mapping):
            msg = f"{where} must be an object with domain, name and value"
            raise InvalidRequest(msg, param=where)
        for key in ("domain", "name", "value"):
            if not isinstance(raw.get(key), str) or not raw.get(key):
                msg = f"{where}.{key} is required and must be a non-empty string"
                raise InvalidRequest(msg, param=f"{where}.{key}")
        domain, name, value = str(raw["domain"]), str(raw["name"]), str(raw["value"])
        problem = entry_problem(domain)
        if problem is not None:
            msg = f"{where}.domain {domain!r} {problem}"
            raise InvalidRequest(msg, param=f"{where}.domain")
        if not any(covers(a, domain) for a in allowed):
            msg = (
                f"{where}.domain {domain!r} is not allowed by allowed_domains; a secret can only "
                "go to a domain the container may reach"
            )
            raise InvalidRequest(msg, param=f"{where}.domain")
        if not _ENV_NAME.match(name) or len(name) > MAX_NAME:
            msg = (
                f"{where}.name {name[:MAX_NAME]!r} must be an environment variable name "
                "(letters, digits and '_', not starting with a digit)"
            )
            raise InvalidRequest(msg, param=f"{where}.name")
        if name in RESERVED_NAMES:
            msg = f"{where}.name {name!r} is reserved by the sandbox; choose another name"
            raise InvalidRequest(msg, param=f"{where}.name")
        if len(value) > MAX_SECRET_VALUE or not _HEADER_SAFE.match(value):
            msg = (
                f"{where}.value must be 1 to {MAX_SECRET_VALUE} printable ASCII characters "
                "(it is sent in HTTP headers)"
            )
            raise InvalidRequest(msg, param=f"{where}.value")
        if (name, domain) in seen:
            msg = f"{where} repeats the secret {name!r} for {domain!r}"
            raise InvalidRequest(msg, param=where)
        seen.add((name, domain))
        out.append(DomainSecret(domain, name, value))
    return tuple(out)


def validate_policy(raw: Mapping[str, Any], *, operator: Sequence[str] | None) -> AllowlistPolicy:
    """An ``{"type": "allowlist", ...}`` request body, checked and normalized."""
    base = "network_policy"
    allowed = validate_allowlist(
        raw.get("allowed_domains"), operator=operator, param=f"{base}.allowed_domains"
    )
    secrets = validate_secrets(raw.get("domain_secrets"), allowed, param=f"{base}.domain_secrets")
    return AllowlistPolicy(allowed, secrets)


def validate_operator_allowlist(patterns: Sequence[str]) -> list[str]:
    """The operator's ``egress.allow``: same entry rules; raises ValueError naming the bad one."""
    out = []
    for p in patterns:
        p = p.strip()
        if not p:
            continue
        problem = entry_problem(p)
        if problem is not None:
            msg = f"egress.allow entry {p!r} {problem}"
            raise ValueError(msg)
        out.append(p)
    if not out:
        msg = "egress.allow must list at least one hostname or glob"
        raise ValueError(msg)
    return out
