"""A sandbox node's entry in the database: registered at start-up (name, address, memory it
offers, what its runtime runs), a heartbeat every ``cluster.heartbeat_s`` with the number of
containers it holds, and ``stopped`` on a clean stop. API replicas read these rows to place
containers and to tell a lost node (silent past ``cluster.node_timeout_s``) from a live one."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os

from shellbox.sandbox import Runtime
from shellbox.store import NodeStore

log = logging.getLogger("shellbox.cluster")


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class NodeRegistration:
    def __init__(
        self,
        store: NodeStore,
        runtime: Runtime,
        *,
        name: str,
        url: str,
        memory_bytes: int,
        heartbeat_s: float,
    ) -> None:
        self.store = store
        self.runtime = runtime
        self.name = name
        self.url = url
        self.memory_bytes = memory_bytes
        self.heartbeat_s = heartbeat_s
        self._task: asyncio.Task[None] | None = None

    def _register(self) -> None:
        info = dataclasses.asdict(self.runtime.describe())
        self.store.register(self.name, self.url, self.memory_bytes, info)

    async def start(self) -> None:
        """Register (a node back after a restart registers under its old name, and its
        containers are routed to it again), then beat in the background."""
        self._register()
        await self.beat()
        log.info(
            "registered as node %s at %s offering %d GiB",
            self.name,
            self.url,
            self.memory_bytes >> 30,
        )
        self._task = asyncio.create_task(self._beat_forever(), name="shellbox-heartbeat")

    async def beat(self) -> None:
        count = len(await self.runtime.list())
        if not self.store.heartbeat(self.name, count):
            # Stopped or removed meanwhile (an operator, a clean stop of a twin under the
            # same name): this node is alive, so it says so again.
            self._register()
            self.store.heartbeat(self.name, count)

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except Exception:  # the database may be away for a moment: beat again next round
                log.exception("node %s: heartbeat failed", self.name)

    async def stop(self) -> None:
        """A clean stop: no more heartbeats, and nothing is placed here until a restart."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.store.deregister(self.name)
        log.info("node %s deregistered", self.name)
