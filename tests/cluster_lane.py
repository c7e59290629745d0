"""The cluster lane's shared parts (imported as ``cluster_lane``; tests/ is not a package):
starting a local cluster (``shellbox.cluster.local``) for the session, and what the API tests
use of ``server`` when it is one.

With SHELLBOX_TEST_CLUSTER=1 the shared ``server`` fixture is not one ``shellbox serve`` but a
whole cluster on this machine (PostgreSQL, two nodes, two API replicas, HAProxy round-robin):
the API tests then send every request to HAProxy's port, so creates and calls alternate
between the replicas (scripts/test.sh's cluster lane runs the containers, calls, files, skills
and egress tests this way).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shellbox.cluster.local import LocalCluster
from shellbox.sandbox import hostns

REPO = Path(__file__).resolve().parent.parent
IMAGE_DIR = REPO / ".state" / "images"
CLUSTER_ENV = "SHELLBOX_TEST_CLUSTER"
# Short enough for the node-loss tests; the rest of the lifecycle as a real deployment's.
NODE_TIMEOUT_S = 3
# 10 MiB: a snapshot of a container holding 6 MiB fits, a second does not (the snapshot test
# in tests/cluster; the API tests run through the lane take no snapshot).
SNAPSHOT_QUOTA_BYTES = 10 << 20
CLUSTER_TEST_ENV = {
    "SHELLBOX_CLUSTER__NODE_TIMEOUT_S": str(NODE_TIMEOUT_S),
    "SHELLBOX_CLUSTER__HEARTBEAT_S": "0.5",
    "SHELLBOX_LIFECYCLE__REAPER_INTERVAL_S": "0.5",
    "SHELLBOX_LIMITS__MAX_SNAPSHOT_GB_PER_PROJECT": str(SNAPSHOT_QUOTA_BYTES / (1 << 30)),
}


def cluster_lane() -> bool:
    return os.environ.get(CLUSTER_ENV, "") == "1"


@dataclass
class ClusterServer:
    """What the API tests use of ``server``, served by a local cluster through HAProxy."""

    cluster: LocalCluster
    env: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return self.cluster.base_url

    @property
    def root_url(self) -> str:
        return self.cluster.root_url

    def shellbox(self, *args: str) -> str:
        return self.cluster.shellbox(*args)

    def create_key(self, project: str) -> str:
        return self.shellbox("keys", "create", "--project", project)


def start_local_cluster(prefix: str, **options: Any) -> LocalCluster:
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    env = {**CLUSTER_TEST_ENV, **options.pop("env", {})}
    return LocalCluster(root, IMAGE_DIR, env=env, **options).start()


def remove_local_cluster(cluster: LocalCluster) -> None:
    try:
        cluster.destroy_sandboxes()  # what the tests left
    finally:
        cluster.stop()
    for name in list(cluster.children):
        if name.startswith("node"):
            hostns.detach(str(cluster.root / name / "disks"))
    shutil.rmtree(cluster.root, ignore_errors=True)
