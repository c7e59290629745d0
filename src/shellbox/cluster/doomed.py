"""The API replicas' housekeeping of what was deleted while its node was unavailable: once the
node is back (a restart, or heartbeats again), the reaper lease holder removes those sandboxes
and stored snapshots from it (``ClusterRuntime.destroy_doomed``), so a delete never waits for a
lost node and never leaves its sandbox behind."""

from __future__ import annotations

from shellbox.cluster.runtime import ClusterRuntime
from shellbox.features import ContainerFeature


class DoomedSweep(ContainerFeature):
    def __init__(self, runtime: ClusterRuntime) -> None:
        self.runtime = runtime

    async def housekeep(self) -> None:
        await self.runtime.destroy_doomed()
