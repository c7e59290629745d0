"""A few containers created and started ahead of time, so that creating one through the API
costs a database row instead of a container start.

Starting a sandbox (``crun run``, the overlay mount, the agent's start-up) takes about 20 ms
on this kind of machine when it is quiet, and several times that under load; the public
sandbox leaderboards time "create, run echo, read the result", and agents feel it on their
first call (bench/bench_http.py: 23 ms p50 through HTTP with the pool, 33-40 ms without).
A pooled container is exactly what a fresh one would be (its spec, an empty ``/mnt/data``,
nothing run in it yet); it is used only when a creation asks for nothing beyond that spec,
otherwise the container is built as before. There is one pool per network policy type:
``disabled`` (the default spec, ``service.containers``) and ``allowlist`` (a container already
in its own egress network namespace, filled by ``egress.service`` once the proxy runs). A
spec's ``env`` is applied per command, not at start, so a pooled container fits a request
whose spec differs from the pooled one in ``env`` only.

Pooled containers are not in the database: a restart destroys them as leftovers
(``ContainerService.recover``) and the pools fill again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from shellbox.errors import SandboxError
from shellbox.ids import new_id
from shellbox.sandbox.base import ContainerSpec, Runtime

log = logging.getLogger("shellbox.warm_pool")
RETRY_AFTER_FAILURE_S = 5.0


class WarmPool:
    def __init__(
        self,
        runtime: Runtime,
        make_spec: Callable[[str], Awaitable[ContainerSpec]],
        size: int,
        *,
        release: Callable[[str], Awaitable[None]] | None = None,
        enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        self.runtime = runtime
        self.make_spec = make_spec  # the spec of a new pooled container with this id
        self.release = release  # gives back what make_spec took, for one never handed out
        self.enabled = enabled  # whether the pool may fill now
        self.size = size
        self._ready: list[ContainerSpec] = []
        self._filler: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    def __len__(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        """Begin filling (after ``ContainerService.recover``, which would destroy pooled
        containers as leftovers)."""
        self._started = True
        self.refill()

    def refill(self) -> None:
        if not (self.size and self._started and not self._closed and self.enabled()):
            return
        if self._filler is None or self._filler.done():
            self._filler = asyncio.create_task(self._fill(), name="shellbox-warm-pool")

    async def _fill(self) -> None:
        # One at a time: a burst of starts would slow down the calls being served.
        while not self._closed and len(self._ready) < self.size:
            cid = new_id("cntr_")
            try:
                spec = await self.make_spec(cid)
                await self.runtime.create(spec)
                await self.runtime.start(cid)
            except asyncio.CancelledError:  # closing: leave nothing half-made behind
                await self._discard(cid)
                raise
            except SandboxError as exc:  # e.g. no free network slot: say it, no traceback
                log.warning("could not start a pooled container (%s); retrying later", exc)
                await self._discard(cid)
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            except Exception:
                log.exception("could not start a pooled container; retrying later")
                await self._discard(cid)
                await asyncio.sleep(RETRY_AFTER_FAILURE_S)
                continue
            if self._closed:
                await self._discard(cid)
                return
            self._ready.append(spec)

    async def take(self) -> ContainerSpec | None:
        """A started container (its spec), now the caller's; None if none is ready (the
        caller then builds one). The pool fills up again in the background."""
        try:
            while self._ready:
                spec = self._ready.pop(0)
                try:
                    responsive = await self.runtime.responsive(spec.id)
                except BaseException:  # the request went away: the container is nobody's
                    await asyncio.shield(self._discard(spec.id))
                    raise
                if not responsive:
                    log.warning("pooled container %s does not answer; dropping it", spec.id)
                    await self._discard(spec.id)
                    continue
                return spec
            return None
        finally:
            self.refill()

    async def _discard(self, cid: str) -> None:
        try:
            await self.runtime.destroy(cid)
        except Exception:
            log.exception("discarding pooled container %s: destroying it failed", cid)
        if self.release is not None:
            try:
                await self.release(cid)
            except Exception:
                log.exception("discarding pooled container %s: releasing its spec failed", cid)

    async def close(self) -> None:
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            # ``_fill`` logs its own failures; cancelled is how it ends here.
            with contextlib.suppress(asyncio.CancelledError):
                await self._filler
        ready, self._ready = self._ready, []
        for spec in ready:
            await self._discard(spec.id)
