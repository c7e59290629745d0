"""``Idempotency-Key`` on creates: the first result of a request is kept, and a retry with the
same key gets it back instead of doing the work again (as payment APIs do).

A key is claimed in the database before the work starts (``in_progress``, with this process's
run token) and holds the result once it succeeded (``done``). A retry finds:

- ``done``, same request: the stored result (``replay``);
- ``done`` or ``in_progress``, another request (route or fingerprint): ``IdempotencyKeyReused``;
- ``in_progress`` by this process: ``IdempotencyKeyInUse`` (a retryable 409);
- ``in_progress`` by a process that died (a crash cut the first request off): the route says
  whether the work may run again (``rerun``; it then takes the key over and learns which
  resource the first attempt had started, if any) or not (``IdempotencyKeyInterrupted``).

Only successes are kept: a failed attempt releases its key, so a retry runs again (a 4xx has
done nothing; a 5xx is a fault the retry may not meet). Keys expire ``idempotency_ttl_s``
after their first use.
"""

from __future__ import annotations

import contextvars
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from shellbox.errors import (
    IdempotencyKeyInterrupted,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    InvalidRequest,
)
from shellbox.service.containers import CreateContainer, Provisioned
from shellbox.service.models import Principal
from shellbox.store import Database
from shellbox.store.tables import metadata

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255
PURGE_INTERVAL_S = 60.0

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("project", String(128), primary_key=True),
    Column("key", String(MAX_KEY_LENGTH), primary_key=True),
    Column("route", Text, nullable=False),  # ids in the path have no length cap
    Column("fingerprint", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # in_progress | done
    Column("run", String(32), nullable=False),  # the process that claimed it
    Column("resource_id", String(64), nullable=True),  # what the first attempt started
    Column("status", Integer, nullable=True),
    Column("content_type", String(128), nullable=True),
    Column("body", LargeBinary, nullable=True),
    Column("created_at", BigInteger, nullable=False),
)


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
# service can link the container it makes to the key (see ``attach_container``).
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
    def __init__(self, db: Database, ttl_s: float) -> None:
        self.db = db
        self.ttl_s = ttl_s
        self.run = secrets.token_hex(8)
        self._next_purge = 0.0

    def begin(
        self, principal: Principal, key: str, route: str, fingerprint: str, *, rerun: bool
    ) -> Begun:
        now = int(time.time())
        values: dict[str, Any] = {
            "project": principal.project,
            "key": key,
            "route": route,
            "fingerprint": fingerprint,
            "state": "in_progress",
            "run": self.run,
            "created_at": now,
        }
        claim = Claim(principal.project, key)
        where = (idempotency_keys.c.project == principal.project, idempotency_keys.c.key == key)
        for _ in range(3):  # lost races with a concurrent insert or purge: look again
            with self.db.begin() as conn:
                row = conn.execute(select(idempotency_keys).where(*where)).first()
                if row is not None and row.created_at < now - self.ttl_s:
                    conn.execute(delete(idempotency_keys).where(*where))
                    row = None
            if row is None:
                try:
                    with self.db.begin() as conn:
                        conn.execute(insert(idempotency_keys).values(**values))
                except IntegrityError:
                    continue
                return Begun(claim=claim)
            if row.route != route or row.fingerprint != fingerprint:
                msg = (
                    f"this {HEADER} was first used with another request ({row.route}, other "
                    "parameters); a key stands for one request: send a new key for a new one"
                )
                raise IdempotencyKeyReused(msg, param=HEADER)
            if row.state == "done":
                return Begun(replay=Stored(row.status, row.content_type, row.body))
            if row.run == self.run:
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
            with self.db.begin() as conn:
                taken = conn.execute(
                    update(idempotency_keys)
                    .where(*where, idempotency_keys.c.run == row.run)
                    .values(run=self.run, resource_id=None)
                ).rowcount
            if taken:
                return Begun(claim=claim, interrupted_resource=row.resource_id)
        msg = f"the {HEADER} is being claimed by concurrent requests; retry in a moment"
        raise IdempotencyKeyInUse(msg, param=HEADER)

    def _where(self, claim: Claim) -> tuple[Any, ...]:
        return (
            idempotency_keys.c.project == claim.project,
            idempotency_keys.c.key == claim.key,
            idempotency_keys.c.run == self.run,
        )

    def finish(self, claim: Claim, result: Stored) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(idempotency_keys)
                .where(*self._where(claim))
                .values(
                    state="done",
                    status=result.status,
                    content_type=result.content_type,
                    body=result.body,
                )
            )

    def release(self, claim: Claim) -> None:
        """Give the key up unless it holds a result (so it is safe after ``finish`` too)."""
        with self.db.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(
                    *self._where(claim), idempotency_keys.c.state == "in_progress"
                )
            )

    def attach(self, claim: Claim, resource_id: str) -> None:
        with self.db.begin() as conn:
            conn.execute(
                update(idempotency_keys).where(*self._where(claim)).values(resource_id=resource_id)
            )

    async def attach_container(
        self, _principal: Principal, _req: CreateContainer, cid: str, _prov: Provisioned
    ) -> None:
        """A provision hook: the container a keyed create is making is written down before
        its record is, so a retry after a crash finds it rather than making a second one."""
        claim = current_claim.get()
        if claim is not None:
            self.attach(claim, cid)

    async def purge_expired(self) -> None:
        """A reaper hook: forget keys older than the TTL (at most once a minute)."""
        now = time.time()
        if now < self._next_purge:
            return
        self._next_purge = now + PURGE_INTERVAL_S
        with self.db.begin() as conn:
            conn.execute(
                delete(idempotency_keys).where(idempotency_keys.c.created_at < now - self.ttl_s)
            )
