"""``shellbox node``: the sandboxes of one machine, served to API servers over HTTP.

A node runs what a one-machine ``shellbox serve`` runs below its service layer: the OCI
runtime (crun or runc), the agent in each container, the skills it holds and the egress
namespaces and proxy (``EgressNetwork``), whose audit it writes to the database at
``--database-url`` (the cluster's; SQLite in its state directory without one). The service
layer above it (the warm pools, the reaper, the APIs) runs in the API servers, which reach
it through ``RemoteRuntime`` (``shellbox.sandbox.remote``).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.applications import Starlette

from shellbox.egress.network import EgressNetwork
from shellbox.node.app import create_node_app
from shellbox.node.info import NodeInfo, node_info
from shellbox.sandbox import Runtime, create_runtime
from shellbox.settings import Settings
from shellbox.store import create_database, create_stores

__all__ = ["Node", "NodeInfo", "build_node", "node_info"]


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

    async def stop() -> None:
        await network.close()
        db.dispose()

    app = create_node_app(runtime, cluster_key, info, on_start=network.start, on_stop=stop)
    return Node(info, runtime, network, app)
