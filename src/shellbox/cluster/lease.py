"""``Lease``: this process's claim on background work that must run on one replica at a time."""

from __future__ import annotations

import logging
import secrets

from shellbox.store import LeaseStore

log = logging.getLogger("shellbox.cluster")


class Lease:
    """``hold()`` each round: True while this process holds the lease (taking it when it is
    free or lapsed, renewing it when it is ours). Another process takes over one ``ttl_s``
    after this one stops renewing (its death); a clean stop ``release``s it at once."""

    def __init__(self, store: LeaseStore, name: str, ttl_s: float) -> None:
        self.store = store
        self.name = name
        self.ttl_ms = int(ttl_s * 1000)
        self.holder = secrets.token_hex(8)
        self.held = False

    def hold(self) -> bool:
        held = self.store.acquire(self.name, self.holder, self.ttl_ms)
        if held != self.held:
            log.info("%s the %s lease (%s)", "took" if held else "lost", self.name, self.holder)
        self.held = held
        return held

    def release(self) -> None:
        if self.held:
            self.store.release(self.name, self.holder)
            self.held = False
