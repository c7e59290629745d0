"""Terminals in containers: open one (waking its container), keep the container awake while
it is in use, and end them all when it sleeps, pauses, expires or is deleted.

A terminal is in use while bytes cross it: keystrokes (or a resize) from the client, output
from the terminal. Each renews the container's activity, as a call does, so a terminal left
open and forgotten (no input, nothing printed) holds the container no longer than a call
would: it sleeps after ``lifecycle.idle_sleep_s`` and its terminals close (1001)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from shellbox.errors import ContainerBusy, ShellboxError
from shellbox.features import ContainerFeature
from shellbox.sandbox.base import PtyRequest, PtySession
from shellbox.service.containers import ContainerService
from shellbox.service.models import ContainerRecord, Principal

log = logging.getLogger("shellbox.pty")


@dataclass(eq=False)
class Terminal:
    """One open terminal and, once the server ended it, why."""

    container_id: str
    session: PtySession
    touch: Callable[[str], None]  # renews a container's activity (``ContainerService.touch``)
    ended: str | None = None

    def used(self) -> None:
        """Bytes crossed the terminal (either way): its container is in use now."""
        self.touch(self.container_id)


class PtyService(ContainerFeature):
    """Opens terminals through ``Runtime.pty``; attached to the container service as a
    feature so that a container's sleep, pause or end closes its terminals (a frozen agent
    could not)."""

    def __init__(self, containers: ContainerService, max_per_container: int) -> None:
        self.containers = containers
        self.max_per_container = max_per_container
        self._open: dict[str, set[Terminal]] = {}
        self._opening: dict[str, int] = {}

    def count(self, cid: str) -> int:
        return len(self._open.get(cid, ())) + self._opening.get(cid, 0)

    @contextlib.asynccontextmanager
    async def open(
        self, principal: Principal, cid: str, request: PtyRequest
    ) -> AsyncIterator[Terminal]:
        """A terminal in the caller's container (404 for another project's), closed when the
        block ends. Opening it is a use of the container (waking it); from then on only the
        terminal's traffic is (``Terminal.used``): a pause, a sleep or the container's end
        is not held back (the features' ``stopping`` and ``release`` end it)."""
        async with self.containers.activity(principal, cid):
            if self.count(cid) >= self.max_per_container:
                msg = (
                    f"container {cid} already has {self.count(cid)} terminals open, the most "
                    "it may (limits.max_ptys_per_container); close one first"
                )
                raise ContainerBusy(msg, param="container_id")
            self._opening[cid] = self._opening.get(cid, 0) + 1
            try:
                session = await self.containers.runtime.pty(cid, request)
            finally:
                self._opening[cid] -= 1
                if not self._opening[cid]:
                    del self._opening[cid]
            terminal = Terminal(cid, session, self.containers.touch)
            self._open.setdefault(cid, set()).add(terminal)
        try:
            yield terminal
        finally:
            terminals = self._open.get(cid)
            if terminals is not None:
                terminals.discard(terminal)
                if not terminals:
                    del self._open[cid]
            await session.close()

    async def end_all(self, cid: str, reason: str) -> None:
        for terminal in list(self._open.get(cid, ())):
            terminal.ended = reason
            try:
                await terminal.session.close()
            except (ShellboxError, OSError) as exc:
                log.warning("closing a terminal of %s failed: %s", cid, exc)

    # -- ContainerFeature ---------------------------------------------------------------------

    async def stopping(self, record: ContainerRecord, status: str) -> None:
        what = "went to sleep" if status == "sleeping" else f"was {status}"
        await self.end_all(record.id, f"container {record.id} {what}")
