"""Many machines (issue 15): sandbox nodes registered in the database, and the API role's
runtime that places containers on them and routes every call to the node holding it.

    ClusterRuntime     the API replicas' ``Runtime``: placement, routing, lost nodes (503)
    NodeRegistration   a node's entry in the database and its heartbeat
    Lease              background work that runs on one replica at a time
"""

from __future__ import annotations

from shellbox.cluster.lease import Lease
from shellbox.cluster.registration import NodeRegistration, machine_memory_bytes
from shellbox.cluster.runtime import ClusterRuntime, Connect

__all__ = ["ClusterRuntime", "Connect", "Lease", "NodeRegistration", "machine_memory_bytes"]
