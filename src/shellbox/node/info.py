"""What a node says about itself: the hook for the cluster's registration (issue 15)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from shellbox.errors import SandboxError
from shellbox.sandbox.remote import read_private_file


@dataclass(frozen=True)
class NodeInfo:
    """Built at the node's start-up; the cluster's registry (nodes table, heartbeat,
    placement) records it."""

    name: str  # unique in the cluster; the hostname by default
    advertise_url: str  # how API servers reach this node's Runtime
    memory_bytes: int  # what its containers may be given in all (placement by memory_limit)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def node_info(
    name: str | None, advertise_url: str | None, host: str, port: int, *, tls: bool = False
) -> NodeInfo:
    """The node's info from its command line: ``advertise_url`` defaults to the address it
    listens on (a wildcard address is replaced by the hostname), https when it serves TLS."""
    if advertise_url is None:
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        if ":" in shown:
            shown = f"[{shown}]"
        advertise_url = f"{'https' if tls else 'http'}://{shown}:{port}"
    return NodeInfo(name or socket.gethostname(), advertise_url, host_memory_bytes())


def tls_files(cert: Path | None, key: Path | None) -> tuple[str, str] | None:
    """The certificate and key files a node serves https with (``cluster.tls_cert_file`` and
    ``cluster.tls_key_file``), checked before it listens; None for plain http."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        msg = "cluster.tls_cert_file and cluster.tls_key_file go together: set both, or neither"
        raise SandboxError(msg)
    read_private_file(key, "TLS key file")
    if not cert.is_file():
        msg = f"TLS certificate file {cert} is missing"
        raise SandboxError(msg)
    return str(cert), str(key)
