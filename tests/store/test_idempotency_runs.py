"""Idempotency claims across servers on one database: a claim held by another server that
is alive is in use (a retryable 409), never taken over; one held by a run that stopped, or
whose server restarted on its state directory, is taken over as after a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from shellbox.errors import IdempotencyKeyInUse
from shellbox.service.idempotency import IdempotencyService
from shellbox.service.models import Principal
from shellbox.store import Stores

P = Principal("p")
ROUTE = "POST /v1/containers"


def service(stores: Stores, run_file: Path | None = None) -> IdempotencyService:
    return IdempotencyService(stores.idempotency, 3600, run_file=run_file)


async def test_a_live_servers_claim_is_not_taken_over(stores: Stores, tmp_path: Path) -> None:
    a, b = service(stores, tmp_path / "a" / "run"), service(stores, tmp_path / "b" / "run")
    await a.start()
    await b.start()
    assert a.begin(P, "k", ROUTE, "f", rerun=True).claim is not None
    with pytest.raises(IdempotencyKeyInUse):
        b.begin(P, "k", ROUTE, "f", rerun=True)  # A is working on it
    await a.close()  # A stopped: its claim is dead, B runs the request again
    taken = b.begin(P, "k", ROUTE, "f", rerun=True)
    assert taken.claim is not None


async def test_a_restart_declares_the_previous_run_dead(stores: Stores, tmp_path: Path) -> None:
    run_file = tmp_path / "private" / "run"
    first = service(stores, run_file)
    await first.start()
    assert run_file.read_text() == first.run and run_file.stat().st_mode & 0o777 == 0o600
    first.begin(P, "k", ROUTE, "f", rerun=True)  # then the process is killed: no close()
    other = service(stores, tmp_path / "other" / "run")
    await other.start()
    with pytest.raises(IdempotencyKeyInUse):
        other.begin(P, "k", ROUTE, "f", rerun=True)  # within its lease, it may be alive
    again = service(stores, run_file)  # the same server, restarted
    await again.start()
    assert again.begin(P, "k", ROUTE, "f", rerun=True).claim is not None


def test_a_run_that_stopped_reporting_is_dead(stores: Stores) -> None:
    i = stores.idempotency
    i.heartbeat("old", 1000)
    i.heartbeat("old", 2000)
    assert i.run_seen("old") == 2000 and i.run_seen("never") is None
    stale = service(stores)
    stale.store.claim("p", "k", route=ROUTE, fingerprint="f", run="old", at=2000)
    assert stale.begin(P, "k", ROUTE, "f", rerun=True).claim is not None  # 2000 is long ago
    i.forget_run("old")
    assert i.run_seen("old") is None
