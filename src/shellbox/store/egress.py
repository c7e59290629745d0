"""Egress: which network slot each allowlisted container holds, and the audit of attempts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy import delete, insert, select

from shellbox.store.db import Database, Order
from shellbox.store.records import LIVE
from shellbox.store.tables import containers, egress_events, egress_slots


class EgressStore(Protocol):
    def live_slots(self) -> dict[str, int]: ...
    def claim_slot(self, cid: str, slot: int, at: int) -> None: ...
    def release_slot(self, cid: str) -> None: ...
    def slot_of(self, cid: str) -> int | None: ...
    def add_events(self, rows: Sequence[Mapping[str, Any]]) -> None: ...
    def events(
        self, cid: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[Mapping[str, Any]], bool]: ...


class SqlEgressStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def live_slots(self) -> dict[str, int]:
        """container id -> slot, for containers that still run or sleep."""
        with self.db.connect() as conn:
            rows = conn.execute(
                select(egress_slots.c.container_id, egress_slots.c.slot)
                .join(containers, containers.c.id == egress_slots.c.container_id)
                .where(containers.c.status.in_(LIVE))
            ).all()
        return {r.container_id: r.slot for r in rows}

    def claim_slot(self, cid: str, slot: int, at: int) -> None:
        """Raises IntegrityError if the slot is taken (``slot`` is unique)."""
        with self.db.begin() as conn:
            conn.execute(insert(egress_slots).values(container_id=cid, slot=slot, created_at=at))

    def release_slot(self, cid: str) -> None:
        with self.db.begin() as conn:
            conn.execute(delete(egress_slots).where(egress_slots.c.container_id == cid))

    def slot_of(self, cid: str) -> int | None:
        with self.db.connect() as conn:
            value = conn.execute(
                select(egress_slots.c.slot).where(egress_slots.c.container_id == cid)
            ).scalar()
        return None if value is None else int(value)

    def add_events(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            with self.db.begin() as conn:
                conn.execute(insert(egress_events), list(rows))

    def events(
        self, cid: str, *, after: str | None, limit: int, order: Order
    ) -> tuple[list[Mapping[str, Any]], bool]:
        page = self.db.page(
            egress_events,
            [egress_events.c.container_id == cid],
            after=after,
            limit=limit,
            order=order,
        )
        return list(page.rows), page.has_more
