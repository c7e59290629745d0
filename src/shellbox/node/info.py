"""What a node says about itself: the hook for the cluster's registration (issue 15)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeInfo:
    """Built at the node's start-up; the cluster's registry (nodes table, heartbeat,
    placement) records it."""

    name: str  # unique in the cluster; the hostname by default
    advertise_url: str  # how API servers reach this node's Runtime
    memory_bytes: int  # what its containers may be given in all (placement by memory_limit)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def node_info(name: str | None, advertise_url: str | None, host: str, port: int) -> NodeInfo:
    """The node's info from its command line: ``advertise_url`` defaults to the address it
    listens on (a wildcard address is replaced by the hostname)."""
    if advertise_url is None:
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        if ":" in shown:
            shown = f"[{shown}]"
        advertise_url = f"http://{shown}:{port}"
    return NodeInfo(name or socket.gethostname(), advertise_url, host_memory_bytes())
