"""Where the egress feature keeps its files, on the host.

Persistent, under ``<state_dir>/egress/`` (must survive a restart, since running containers
hold the CA and the proxy's address):

    ca/               mitmproxy's confdir: the CA key and certificate (0700, root only)
    egress-ca.crt     the CA certificate alone, mounted into containers (NODE_EXTRA_CA_CERTS)
    ca-bundle.crt     the image's system bundle + our CA, mounted over the container's one
    node-proxy.cjs    node's preload that routes http, https and fetch through the proxy
    upstream-ca.pem   this host's system bundle + ``egress.upstream_ca``: what upstream TLS
                      is verified against
    proxy_port        the proxy's port, chosen once
    proxy.log         the proxy's own output (never a secret: the addon logs no header)

Volatile, under ``<run dir of the runtime>/egress/`` (tmpfs, 0700; the names must match
``addon.py``): ``policy.json`` (with the secrets, 0600), ``audit.jsonl``, ``ready``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

POLICY_FILE = "policy.json"  # must match addon.py
AUDIT_FILE = "audit.jsonl"  # must match addon.py
READY_FILE = "ready"  # must match addon.py

# Inside the container.
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_IN_CONTAINER = "/usr/local/share/ca-certificates/shellbox-egress.crt"
NODE_PRELOAD_IN_CONTAINER = "/usr/local/lib/shellbox/node-proxy.cjs"


@dataclass(frozen=True)
class EgressPaths:
    state: Path
    run: Path

    @property
    def confdir(self) -> Path:
        return self.state / "ca"

    @property
    def mitm_ca(self) -> Path:
        """Written by mitmproxy at its first start."""
        return self.confdir / "mitmproxy-ca-cert.pem"

    @property
    def ca_cert(self) -> Path:
        return self.state / "egress-ca.crt"

    @property
    def ca_bundle(self) -> Path:
        return self.state / "ca-bundle.crt"

    @property
    def node_preload(self) -> Path:
        return self.state / "node-proxy.cjs"

    @property
    def upstream_bundle(self) -> Path:
        return self.state / "upstream-ca.pem"

    @property
    def port_file(self) -> Path:
        return self.state / "proxy_port"

    @property
    def log(self) -> Path:
        return self.state / "proxy.log"

    @property
    def policy(self) -> Path:
        return self.run / POLICY_FILE

    @property
    def audit(self) -> Path:
        return self.run / AUDIT_FILE

    @property
    def audit_offset(self) -> Path:
        return self.run / "audit.offset"

    @property
    def ready(self) -> Path:
        return self.run / READY_FILE

    def make(self) -> None:
        # The container's root (an unprivileged host uid) must reach the two mounted files.
        self.state.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state, 0o711)
        self.confdir.mkdir(exist_ok=True)
        os.chmod(self.confdir, 0o700)
        self.run.mkdir(parents=True, exist_ok=True)
        os.chmod(self.run, 0o700)


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` whole (readers see the old or the new file, never half of one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)
