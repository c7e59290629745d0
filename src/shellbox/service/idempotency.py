"""``Idempotency-Key`` on creates: the first result of a request is kept, and a retry with the
same key gets it back instead of doing the work again (as payment APIs do).

A key is claimed in the database before the work starts (``in_progress``, with this process's
run token) and holds the result once it succeeded (``done``). A retry finds:

- ``done``, same request: the stored result (``replay``);
- ``done`` or ``in_progress``, another request (route or fingerprint): ``IdempotencyKeyReused``;
- ``in_progress`` by this process, or by another server that is alive (it reported within
  ``lease_s``, see ``server_runs``): ``IdempotencyKeyInUse`` (a retryable 409);
- ``in_progress`` by a process that died (a crash cut the first request off; a server
  restarted on its state directory declares its previous run dead at once): the route says
  whether the work may run again (``rerun``; it then takes the key over and learns which
  resource the first attempt had started, if any) or not (``IdempotencyKeyInterrupted``).

Only successes are kept: a failed attempt releases its key, so a retry runs again (a 4xx has
done nothing; a 5xx is a fault the retry may not meet). Keys expire ``idempotency_ttl_s``
after their first use.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from shellbox.errors import (
    IdempotencyKeyInterrupted,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidRequest,
)
from shellbox.features import ContainerFeature, CreateContainer, Provisioned
from shellbox.service.models import Principal
from shellbox.store import IdempotencyStore
from shellbox.store.tables import MAX_IDEMPOTENCY_KEY_LENGTH

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = MAX_IDEMPOTENCY_KEY_LENGTH
PURGE_INTERVAL_S = 60.0
MIN_LEASE_S = 30.0


@dataclass(frozen=True)
class Stored:
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Claim:
    project: str
    key: str


@dataclass(frozen=True)
class Begun:
    """What ``begin`` decided: a result to replay, or a claim to run the work under (with the
    resource an interrupted first attempt had started, when it is a rerun)."""

    replay: Stored | None = None
    claim: Claim | None = None
    interrupted_resource: str | None = None


# The claim of the request being served, so that a provision hook deep in the container
# service can link the container it makes to the key (see ``KeyedCreations``).
current_claim: contextvars.ContextVar[Claim | None] = contextvars.ContextVar(
    "shellbox_idempotency_claim", default=None
)


def check_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " < c <= "~" for c in key):
        msg = (
            f"the {HEADER} header must be 1 to {MAX_KEY_LENGTH} visible ASCII characters "
            "(a UUID is a good key)"
        )
        raise InvalidRequest(msg, param=HEADER)
    return key


class IdempotencyService:
    def __init__(
        self,
        store: IdempotencyStore,
        ttl_s: float,
        *,
        run_file: Path | None = None,
        heartbeat_s: float = 5.0,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.run = secrets.token_hex(8)
        # This server's run token is kept here, so that the next start on the same state
        # directory knows the run it replaces is dead (no need to wait out the lease).
        self.run_file = run_file
        # Another server's claim is live while it reports within this (it reports every
        # reaper round).
        self.lease_s = max(MIN_LEASE_S, 6 * heartbeat_s)
        self._next_purge = 0.0

    async def start(self) -> None:
        """Declare the run this state directory had before dead, and report this one."""
        if self.run_file is not None:
            self.run_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                previous = self.run_file.read_text().strip()
                if previous:
                    self.store.forget_run(previous)
            fd = os.open(self.run_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.run)
        self.store.heartbeat(self.run, int(time.time()))

    async def close(self) -> None:
        """A clean stop: this run's claims are dead from now on."""
        self.store.forget_run(self.run)

    def _alive(self, run: str, now: int) -> bool:
        seen = self.store.run_seen(run)
        return seen is not None and seen >= now - self.lease_s

    def begin(
        self, principal: Principal, key: str, route: str, fingerprint: str, *, rerun: bool
    ) -> Begun:
        now = int(time.time())
        project = principal.project
        claim = Claim(project, key)
        for _ in range(3):  # lost races with a concurrent insert or purge: look again
            row = self.store.get(project, key, expired_before=int(now - self.ttl_s))
            if row is None:
                if not self.store.claim(
                    project, key, route=route, fingerprint=fingerprint, run=self.run, at=now
                ):
                    continue
                return Begun(claim=claim)
            if row.route != route or row.fingerprint != fingerprint:
                msg = (
                    f"this {HEADER} was first used with another request ({row.route}, other "
                    "parameters); a key stands for one request: send a new key for a new one"
                )
                raise IdempotencyKeyReused(msg, param=HEADER)
            if row.state == "done":
                assert row.status is not None and row.content_type is not None
                return Begun(replay=Stored(row.status, row.content_type, row.body or b""))
            if row.run == self.run or self._alive(row.run, now):
                msg = (
                    f"the first request with this {HEADER} is still running; retry in a "
                    "moment to get its result"
                )
                raise IdempotencyKeyInUse(msg, param=HEADER)
            if not rerun:
                msg = (
                    f"the first request with this {HEADER} was cut off by a server restart and "
                    "may have run in part; check its effects, then send a new key to run it again"
                )
                raise IdempotencyKeyInterrupted(msg, param=HEADER)
            if self.store.take_over(project, key, old_run=row.run, run=self.run):
                return Begun(claim=claim, interrupted_resource=row.resource_id)
        msg = f"the {HEADER} is being claimed by concurrent requests; retry in a moment"
        raise IdempotencyKeyInUse(msg, param=HEADER)

    def finish(self, claim: Claim, result: Stored) -> None:
        self.store.finish(
            claim.project,
            claim.key,
            self.run,
            status=result.status,
            content_type=result.content_type,
            body=result.body,
        )

    def release(self, claim: Claim) -> None:
        """Give the key up unless it holds a result (so it is safe after ``finish`` too)."""
        self.store.release(claim.project, claim.key, self.run)

    def attach(self, claim: Claim, resource_id: str) -> None:
        self.store.attach(claim.project, claim.key, self.run, resource_id)

    async def heartbeat(self) -> None:
        """Report this run alive (every process, each reaper round: its claims stay its own)."""
        self.store.heartbeat(self.run, int(time.time()))

    async def purge_expired(self) -> None:
        """Each reaper round: report this run alive; forget keys older than the TTL (at most once
        a minute)."""
        now = time.time()
        self.store.heartbeat(self.run, int(now))
        if now < self._next_purge:
            return
        self._next_purge = now + PURGE_INTERVAL_S
        self.store.purge(int(now - self.ttl_s))


@dataclass(frozen=True)
class KeyedCreations(ContainerFeature):
    """The idempotency service's part in container creation (its own ``release`` is a
    claim's): the container a keyed create is making is written down before its record is,
    so a retry after a crash finds it rather than making a second one; and each reaper round
    purges what expired."""

    service: IdempotencyService

    async def provision(
        self, principal: Principal, req: CreateContainer, cid: str, prov: Provisioned
    ) -> None:
        claim = current_claim.get()
        if claim is not None:
            self.service.attach(claim, cid)

    async def housekeep(self) -> None:
        await self.service.purge_expired()
