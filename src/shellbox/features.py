"""What container creation asks of a feature, and the values it hands them.

The container service (``service/containers.py``) runs creation; the features beside it
(egress, skills) and the core services that keep per-container state (files, idempotency)
take part through ``ContainerFeature``, attached by the composition root (``services.py``).
They live here, below the service layer, so that a feature imports nothing from the layer
that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from shellbox.principal import Principal
from shellbox.sandbox import NetworkSpec, SkillMount
from shellbox.store.records import ContainerRecord

# The network policy types a container may ask for; each may have a warm pool.
PolicyType = Literal["disabled", "allowlist"]


@dataclass
class CreateContainer:
    name: str
    memory_limit: str = "1g"
    expires_after_minutes: int | None = None
    file_ids: list[str] = field(default_factory=list)
    network_policy: dict[str, Any] = field(default_factory=lambda: {"type": "disabled"})
    skills: list[dict[str, Any]] = field(default_factory=list)
    snapshot_id: str | None = None  # start from this snapshot's files


@dataclass
class Provisioned:
    """What the egress and skills features add to a container's spec, all by value (and what
    their checks found, for their provisioning to use rather than validate again)."""

    # The request's network policy as the egress check validated it (its own type: the
    # container service only carries it to the egress provision hook).
    allowlist: object | None = None
    env: dict[str, str] = field(default_factory=dict)
    skill_mounts: list[SkillMount] = field(default_factory=list)  # installed in the runtime
    files: dict[str, str] = field(default_factory=dict)  # read-only, destination -> text
    network: NetworkSpec | None = None  # allowlist and secrets, for the runtime's proxy
    hosts: dict[str, str] = field(default_factory=dict)
    network_policy: dict[str, Any] = field(default_factory=lambda: {"type": "disabled"})
    secrets: list[dict[str, str]] = field(default_factory=list)
    skills: list[dict[str, Any]] = field(default_factory=list)


class ContainerFeature(Protocol):
    """A feature's part in a container's life. The container service calls every attached
    feature at each step, in the order they were attached; a feature implements the steps it
    takes part in and inherits the others (doing nothing) by subclassing this protocol."""

    def check(self, principal: Principal, req: CreateContainer, prov: Provisioned) -> None:
        """Before anything is allocated: raise ``InvalidRequest``, or note in ``prov`` what
        was validated, for ``provision`` to use."""
        return

    async def provision(
        self, principal: Principal, req: CreateContainer, cid: str, prov: Provisioned
    ) -> None:
        """Under the container's id, before its sandbox is made: fill in this feature's part
        of ``prov`` (or raise ``InvalidRequest``)."""
        return

    async def before_start(self, record: ContainerRecord) -> None:
        """Before the sandbox starts: at creation, at a wake, after a restart."""
        return

    async def woke(self, record: ContainerRecord) -> None:
        """A sleeping or paused container runs again: a call woke it (after ``before_start``
        when it had been stopped)."""
        return

    async def stopping(self, record: ContainerRecord, status: str) -> None:
        """The container's processes are about to be frozen or ended, as it goes ``status``
        (sleeping, paused, expired, deleted): end what cannot outlive them (open terminals)."""
        return

    async def release(self, record: ContainerRecord) -> None:
        """The container ended, or its creation failed half-way: undo what it held."""
        return

    async def housekeep(self) -> None:
        """Once per reaper round: this feature's own periodic cleaning."""
        return

    def remembered(self) -> set[str]:
        """The containers this feature keeps something of in this process's memory."""
        return set()

    def forget(self, cid: str) -> None:
        """The container has ended, perhaps through another process on the same database
        (whose ``release`` ran there, not here): drop what this process keeps of it."""
        return
