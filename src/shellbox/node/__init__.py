"""``shellbox node``: the sandboxes of one machine, served to API servers over HTTP.

A node runs what a one-machine ``shellbox serve`` runs below its service layer: the OCI
runtime (crun or runc), the agent in each container, the skills it holds and the egress
namespaces and proxy (``EgressNetwork``), whose audit it writes to the database at
``--database-url`` (the cluster's; SQLite in its state directory without one). The service
layer above it (the warm pools, the reaper, the APIs) runs in the API servers, which reach
it through ``RemoteRuntime`` (``shellbox.sandbox.remote``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette.applications import Starlette

from shellbox.cluster import NodeRegistration
from shellbox.egress.network import EgressNetwork
from shellbox.node.app import create_node_app
from shellbox.node.info import NodeInfo, node_info
from shellbox.sandbox import Runtime, create_runtime
from shellbox.settings import Settings
from shellbox.store import create_database, create_stores

__all__ = ["Node", "NodeInfo", "build_node", "node_info"]
log = logging.getLogger("shellbox.node")


@dataclass
class Node:
    info: NodeInfo
    runtime: Runtime
    network: EgressNetwork
    app: Starlette


def build_node(settings: Settings, cluster_key: str, info: NodeInfo) -> Node:
    """Everything a node runs, wired (the sandbox image is built first if it is missing).
    Called before any thread starts: the runtime enters its own mount namespace."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url())
    stores = create_stores(db)
    network = EgressNetwork(settings, stores.egress)
    runtime = create_runtime(settings, network=network)
    memory_gb = settings.cluster.node_memory_gb
    registration = NodeRegistration(
        stores.nodes,
        runtime,
        name=info.name,
        url=info.advertise_url,
        memory_bytes=int(memory_gb * (1 << 30)) if memory_gb else info.memory_bytes,
        heartbeat_s=settings.cluster.heartbeat_s,
    )

    async def start() -> None:
        await network.start()
        # Back after a crash or a reboot: its containers run again, files intact (adopted
        # when their agent still answers), before the replicas are told it is up.
        recovered = await runtime.recover()
        if recovered:
            log.info("node %s recovered %d containers: %s", info.name, len(recovered), recovered)
        await registration.start()

    async def stop() -> None:
        try:
            await registration.stop()  # a clean stop: nothing is placed here from now on
        finally:
            await network.close()
            db.dispose()

    app = create_node_app(runtime, cluster_key, info, on_start=start, on_stop=stop)
    return Node(info, runtime, network, app)
