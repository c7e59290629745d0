"""Sandbox time, per project, as OpenRouter prices its shell.

Rules (the README's "Metering" section says the same for operators):

- A request's clock starts when it first runs a command in a container and stops when it
  completes: a response or message when its final event is ready, a direct call on
  ``/v1/containers/{id}/calls`` when its output item is. A request that runs no command is
  not billed; idle containers cost nothing.
- A request that created its container or woke it from sleep is billed at least
  ``metering.minimum_s`` (30 s). Which containers were started and not billed since is kept
  in memory: a container created or woken is marked, and the next request billed on it pays
  the minimum and clears the mark. (A server restart does not mark the containers it
  restarts: the operator's restart is not the customer's.)
- One usage row per completed request, keyed by the request's id and written in the
  transaction that completes it (with the stored response, when there is one): a crash
  before that commit leaves neither the response nor the row, after it leaves both, and no
  request id is ever written twice. A request cut off (crash, client gone) is not billed.
- Price: ``metering.price_per_second_usd`` per billed second (default US$0.0001).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from shellbox.features import ContainerFeature, CreateContainer, Provisioned
from shellbox.ids import new_id
from shellbox.service.metrics import Metrics
from shellbox.service.models import ContainerRecord, Principal
from shellbox.settings import MeteringSettings
from shellbox.store.metering import SandboxUsage, UsageKind, UsageStore


@dataclass
class SandboxClock:
    """One request's clock: ``start`` at each command (the first one counts)."""

    started_ns: int | None = None  # monotonic
    started_at_ms: int | None = None  # wall clock, for the record

    def start(self) -> None:
        if self.started_ns is None:
            self.started_ns = time.monotonic_ns()
            self.started_at_ms = time.time_ns() // 1_000_000


class MeteringService(ContainerFeature):
    def __init__(
        self,
        settings: MeteringSettings,
        usage: UsageStore,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.usage = usage
        self.metrics = metrics
        self._fresh: set[str] = set()  # containers started and not billed since

    # -- hooks on the container service -----------------------------------------------------

    async def provision(
        self, principal: Principal, req: CreateContainer, cid: str, prov: Provisioned
    ) -> None:
        self._fresh.add(cid)
        self.metrics.creates.inc()

    async def woke(self, record: ContainerRecord) -> None:
        self._fresh.add(record.id)

    async def release(self, record: ContainerRecord) -> None:
        self._fresh.discard(record.id)  # ended (or its creation failed): nothing to bill

    def remembered(self) -> set[str]:
        return set(self._fresh)

    def forget(self, cid: str) -> None:
        self._fresh.discard(cid)

    # -- billing ----------------------------------------------------------------------------

    def usage_of(
        self,
        request_id: str,
        principal: Principal,
        container_id: str,
        kind: UsageKind,
        clock: SandboxClock,
    ) -> SandboxUsage | None:
        """The usage of a request that completes now (None: it ran no command)."""
        if clock.started_ns is None or clock.started_at_ms is None:
            return None
        measured_ms = (time.monotonic_ns() - clock.started_ns) // 1_000_000
        started = container_id in self._fresh
        self._fresh.discard(container_id)
        minimum_ms = int(self.settings.minimum_s * 1000)
        return SandboxUsage(
            id=request_id,
            project=principal.project,
            api_key_id=principal.key_id,
            container_id=container_id,
            kind=kind,
            started_at_ms=clock.started_at_ms,
            ended_at_ms=clock.started_at_ms + measured_ms,
            measured_ms=measured_ms,
            billed_ms=max(measured_ms, minimum_ms) if started else measured_ms,
            started_container=started,
        )

    def bill(self, usage: SandboxUsage | None) -> None:
        """Write ``usage`` in a transaction of its own: for requests whose completion writes
        nothing else (direct calls, unstored responses; a stored response is written with
        its usage by ``ResponseStore.save``)."""
        if usage is not None:
            self.usage.record(usage)

    def direct_call(self, principal: Principal, cid: str, kind: str) -> MeteredCall:
        """Meter a call on ``/v1/containers/{id}/calls`` that starts now."""
        return MeteredCall(self, principal, cid, kind)

    def cost_usd(self, billed_ms: int) -> float:
        return billed_ms / 1000 * self.settings.price_per_second_usd


class MeteredCall:
    """A direct call's clock: from its start to its output item (``done``)."""

    def __init__(self, metering: MeteringService, principal: Principal, cid: str, kind: str):
        self.metering = metering
        self.principal = principal
        self.cid = cid
        self.kind = kind
        self.clock = SandboxClock()
        self.clock.start()

    def done(self, out: dict[str, Any]) -> None:
        """The call completed with ``out``: counted, and billed in a transaction of its own
        (nothing else is written when a call completes)."""
        assert self.clock.started_ns is not None
        seconds = (time.monotonic_ns() - self.clock.started_ns) / 1e9
        self.metering.metrics.observe_call(self.kind, seconds, out)
        usage = self.metering.usage_of(
            new_id("call_"), self.principal, self.cid, "call", self.clock
        )
        self.metering.bill(usage)
