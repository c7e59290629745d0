"""The database handle and the one pagination rule every list endpoint shares."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Engine, Table, create_engine, event, select
from sqlalchemy.engine import Connection
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ColumnElement

from shellbox.store.tables import metadata

Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class Page:
    rows: list[Mapping[str, Any]]
    has_more: bool


class Database:
    """Owns the engine. Queries are short and local, so they run on the caller's thread: a
    thread hop would cost more than the query (SQLite in WAL mode, or a nearby PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def begin(self) -> Any:
        return self.engine.begin()

    def connect(self) -> Connection:
        return self.engine.connect()

    def page(
        self,
        table: Table,
        where: Sequence[ColumnElement[bool]],
        *,
        after: str | None,
        limit: int,
        order: Order,
    ) -> Page:
        """Cursor pagination by creation order; ``after`` is the id of the previous page's last
        element (and must be one of the listed objects, or the list starts at the top)."""
        with self.engine.connect() as conn:
            conds = list(where)
            if after:
                anchor = conn.execute(
                    select(table.c.seq).where(table.c.id == after, *where)
                ).scalar()
                if anchor is not None:
                    conds.append(table.c.seq > anchor if order == "asc" else table.c.seq < anchor)
            key = table.c.seq.asc() if order == "asc" else table.c.seq.desc()
            rows = conn.execute(select(table).where(*conds).order_by(key).limit(limit + 1))
            found = [r._mapping for r in rows]
        return Page(found[:limit], len(found) > limit)

    def dispose(self) -> None:
        self.engine.dispose()


def create_database(url: str) -> Database:
    if url.startswith("sqlite"):
        memory = url in ("sqlite://", "sqlite:///:memory:")
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            poolclass=StaticPool if memory else None,
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    else:
        engine = create_engine(url, pool_pre_ping=True)
    metadata.create_all(engine)
    return Database(engine)
