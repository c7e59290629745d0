"""A few containers created and started ahead of time, so that creating one through the API
costs a database row instead of a container start.

Starting a sandbox (``crun run``, the overlay mount, the agent's start-up) takes about 20 ms
on this kind of machine when it is quiet, and several times that under load; the public
sandbox leaderboards time "create, run echo, read the result", and agents feel it on their
first call (bench/bench_http.py: 23 ms p50 through HTTP with the pool, 33-40 ms without).
A pooled container is exactly what a fresh one would be (the default spec, an empty
``/mnt/data``, nothing run in it yet); it is used only when a creation asks for nothing
beyond that spec (memory ``1g``, no network allowlist, no skills), otherwise the container
is built as before.

Pooled containers are not in the database: a restart destroys them as leftovers
(``ContainerService.recover``) and the pool fills again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from shellbox.agent import client as agent_client
from shellbox.errors import AgentUnavailable
from shellbox.ids import new_id
from shellbox.sandbox import ContainerSpec, OciRuntime

log = logging.getLogger("shellbox.warm_pool")
RETRY_AFTER_FAILURE_S = 5.0


class WarmPool:
    def __init__(
        self, runtime: OciRuntime, spec: Callable[[str], ContainerSpec], size: int
    ) -> None:
        self.runtime = runtime
        self.spec = spec  # the default spec for a container id
        self.size = size
        self._ready: list[str] = []
        self._filler: asyncio.Task[None] | None = None
        self._closed = False

    def __len__(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        self._refill()

    def _refill(self) -> None:
        if self.size and not self._closed and (self._filler is None or self._filler.done()):
            self._filler = asyncio.create_task(self._fill(), name="shellbox-warm-pool")

    async def _fill(self) -> None:
        # One at a time: a burst of starts would slow down the calls being served.
        while not self._closed and len(self._ready) < self.size:
            cid = new_id("cntr_")
            try:
                await self.runtime.create(self.spec(cid))
                await self.runtime.start(cid)
            except asyncio.CancelledError:  # closing: leave nothing half-made behind
                with contextlib.suppress(Exception):
                    await self.runtime.destroy(cid)
                raise
            except Exception:
                log.exception("could not start a pooled container; retrying later")
                with contextlib.suppress(Exception):
                    await self.runtime.destroy(cid)
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            if self._closed:
                await self.runtime.destroy(cid)
                return
            self._ready.append(cid)

    async def take(self) -> str | None:
        """A started container with the default spec, now the caller's; None if none is ready
        (the caller then builds one). The pool fills up again in the background."""
        try:
            while self._ready:
                cid = self._ready.pop(0)
                try:
                    await agent_client.ping(self.runtime.socket_path(cid))
                except (AgentUnavailable, OSError, ValueError):
                    log.warning("pooled container %s does not answer; dropping it", cid)
                    with contextlib.suppress(Exception):
                        await self.runtime.destroy(cid)
                    continue
                return cid
            return None
        finally:
            self._refill()

    async def close(self) -> None:
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._filler
        ready, self._ready = self._ready, []
        for cid in ready:
            with contextlib.suppress(Exception):
                await self.runtime.destroy(cid)
