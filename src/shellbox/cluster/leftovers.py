"""The API replicas' sweep of snapshots stored on a node that the database does not know: a
replica that died between the node taking a snapshot and its row being written leaves one,
and so does a delete cut off by a crash. One server sweeps its own at start
(``SnapshotService.sweep``); a cluster's reaper lease holder sweeps each node that is up, once
per registration of it (its start, or its return after a restart: what the database lost
track of meanwhile is found then); each replica sweeps every node the first time it holds the
lease (the previous holder may have died half-way through a sweep).

A snapshot being taken right now is on its node before its row is written: one placed less
than ``GRACE_S`` ago is kept, and its node is looked at again once it is old enough. A node
snapshot call gives up after ``RemoteRuntime``'s 600 s (and undoes its placement), so a
placement older than the grace without a row is nobody's.
"""

from __future__ import annotations

import logging
import time

from shellbox.cluster.runtime import ClusterRuntime
from shellbox.errors import ShellboxError
from shellbox.features import ContainerFeature
from shellbox.store import SnapshotStore

log = logging.getLogger("shellbox.cluster")
GRACE_S = 900.0


class SnapshotLeftoverSweep(ContainerFeature):
    def __init__(
        self, runtime: ClusterRuntime, snapshots: SnapshotStore, *, grace_s: float = GRACE_S
    ) -> None:
        self.runtime = runtime
        self.snapshots = snapshots
        self.grace_ms = int(grace_s * 1000)
        self.swept: dict[str, int] = {}  # node -> the registration (registered_at_ms) swept
        self.again_at: dict[str, float] = {}  # node -> when to look at its young ones again

    async def housekeep(self) -> None:
        for node in self.runtime.nodes.all():
            if not node.available(self.runtime.timeout_ms):
                continue
            again = self.again_at.get(node.name)
            due = again is not None and time.monotonic() >= again
            if self.swept.get(node.name) == node.registered_at_ms and not due:
                continue
            try:
                done = await self.runtime.remove_snapshot_leftovers(
                    node, self.snapshots.ids, self.grace_ms
                )
            except (ShellboxError, OSError) as exc:  # lost meanwhile: the next round again
                log.warning("sweeping leftover snapshots of node %s: %s", node.name, exc)
                continue
            self.swept[node.name] = node.registered_at_ms
            if done.recheck_in_ms is None:
                self.again_at.pop(node.name, None)
            else:
                self.again_at[node.name] = time.monotonic() + done.recheck_in_ms / 1000
            if done.removed:
                log.info("removed %d leftover snapshots from node %s", len(done.removed), node.name)
