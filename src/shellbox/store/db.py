"""The database handle and the one pagination rule every list endpoint shares."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import (
    URL,
    Column,
    Engine,
    Insert,
    Select,
    Table,
    create_engine,
    event,
    make_url,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from shellbox.errors import InvalidRequest

Order = Literal["asc", "desc"]
log = logging.getLogger("shellbox.store")
PRIVATE_DIR = "private"  # must match settings.py
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


@dataclass(frozen=True)
class Page:
    rows: Sequence[Mapping[Any, Any]]
    has_more: bool


Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Hot:
    """A statement ``first_row`` or ``write`` runs, compiled once for this database: kept,
    so that the id() of the statement it holds stays that statement's."""

    statement: ClauseElement
    sql: str
    binds: tuple[tuple[str, Processor, Any], ...]  # name, processor, the statement's value
    positional: bool  # binds in the SQL's order, or by name
    columns: tuple[tuple[str, Processor], ...]  # name, result processor (reads)

    def args(self, params: Mapping[str, Any]) -> Any:
        """The driver's parameters: ``params``, or the value written in the statement."""
        values = [
            (name, convert(value) if convert is not None else value)
            for name, convert, default in self.binds
            for value in (params.get(name, default),)
        ]
        if self.positional:
            return tuple(value for _, value in values)
        return dict(values)


def insert_new(dialect: Dialect, table: Table, key: Column[Any]) -> Insert:
    """An INSERT into ``table`` that skips a row whose ``key`` (unique) exists already:
    ``ON CONFLICT DO NOTHING``, which SQLite and PostgreSQL both speak; its rowcount says
    whether the row was written. For ``Database.write`` or a Connection's ``execute``."""
    if dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=[key])
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=[key])


class Database:
    """Owns the engine. Queries are short and local, so they run on the caller's thread: a
    thread hop would cost more than the query (SQLite in WAL mode, or a nearby PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._hot: dict[int, _Hot] = {}  # by id() of the statement it holds

    def begin(self) -> Any:
        return self.engine.begin()

    def connect(self) -> Connection:
        return self.engine.connect()

    def first_row(self, statement: Select[Any], params: Mapping[str, Any]) -> dict[str, Any] | None:
        """The first row of a read on every request's path (the key's lookup, the container's
        row), by column name, through the driver's own connection from the pool. The statement
        is compiled once for this database and its columns converted by their types' own
        result processors (JSON, booleans), as SQLAlchemy would; what does not run is its
        per-execution machinery (Connection, execution context, Result), which in the server
        took several times the query itself."""
        hot = self._compiled(statement, params)
        row, _ = self._run(hot, params, write=False)
        if row is None:
            return None
        return {
            key: convert(value) if convert is not None else value
            for (key, convert), value in zip(hot.columns, row, strict=True)
        }

    def write(self, statement: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run one INSERT, UPDATE or DELETE on every request's path in a transaction of its
        own, as ``first_row`` runs its reads (compiled once, through the driver's connection);
        returns how many rows it changed. For an INSERT, ``params`` names the columns it sets,
        the same ones at every call."""
        _, changed = self._run(self._compiled(statement, params), params, write=True)
        return changed

    def _run(self, hot: _Hot, params: Mapping[str, Any], *, write: bool) -> tuple[Any, int]:
        """Execute on a pooled driver connection: (the first row, or None for a write; the
        rows changed). A write is committed; whatever else goes back to the pool, where its
        transaction is rolled back."""
        conn = self.engine.raw_connection()
        try:
            cursor = conn.cursor()
            try:
                cursor.execute(hot.sql, hot.args(params))
                row = None if write else cursor.fetchone()
                changed = int(cursor.rowcount)
            finally:
                cursor.close()
            if write:
                conn.commit()
        finally:
            conn.close()
        return row, changed

    def _compiled(self, statement: ClauseElement, params: Mapping[str, Any]) -> _Hot:
        hot = self._hot.get(id(statement))
        if hot is not None:
            return hot
        dialect = self.engine.dialect
        compiled = statement.compile(dialect=dialect, column_keys=list(params))
        assert isinstance(compiled, SQLCompiler)  # a statement, not DDL
        names = compiled.positiontup or list(compiled.binds)
        binds = tuple(
            (name, bind.type.dialect_impl(dialect).bind_processor(dialect), bind.value)
            for name in names
            for bind in (compiled.binds[name],)
        )
        selected = getattr(statement, "selected_columns", ())
        columns = tuple(
            (str(c.key), c.type.dialect_impl(dialect).result_processor(dialect, None))
            for c in selected
        )
        return self._hot.setdefault(
            id(statement),
            _Hot(statement, str(compiled), binds, bool(compiled.positiontup), columns),
        )

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

    def scrub(self) -> None:
        """Leave no deleted or overwritten bytes behind in the file (SQLite: its WAL and
        free pages; PostgreSQL's storage is the operator's to manage)."""
        if self.engine.dialect.name == "sqlite":
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
                conn.execute(text("VACUUM"))
                conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))

    def dispose(self) -> None:
        self.engine.dispose()


SQLITE_DRIVERS = ("sqlite", "sqlite+pysqlite")
POSTGRES_DRIVER = "postgresql+psycopg"
URL_HELP = "use sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"


def check_url(raw: str) -> URL:
    """Parse a database URL, or say clearly what is wrong with it (``postgresql://`` is taken
    to mean psycopg 3, the only PostgreSQL driver shellbox ships with)."""
    try:
        url = make_url(raw)
    except ArgumentError:
        msg = f"store.database_url is not a database URL; {URL_HELP}"
        raise InvalidRequest(msg, param="database_url") from None
    if url.drivername == "postgresql":
        url = url.set(drivername=POSTGRES_DRIVER)
    if url.drivername not in (*SQLITE_DRIVERS, POSTGRES_DRIVER):
        msg = f"store.database_url: the {url.drivername!r} driver is not supported; {URL_HELP}"
        raise InvalidRequest(msg, param="database_url")
    if url.drivername == POSTGRES_DRIVER and importlib.util.find_spec("psycopg") is None:
        msg = (
            "store.database_url is a PostgreSQL URL but the psycopg package is missing; "
            "install it with: pip install 'shellbox[postgres]'"
        )
        raise InvalidRequest(msg, param="database_url")
    return url


def secure_sqlite_files(path: Path) -> None:
    """The database (API key hashes, sealed secrets) is for root only: the file and its WAL
    and shared-memory files 0600 (SQLite gives those the database file's mode, so it is
    created 0600 before SQLite opens it), the default ``private`` directory 0700.

    The default database used to be ``<state_dir>/shellbox.db``, in a directory containers
    must traverse: found there, it is moved into ``<state_dir>/private``."""
    parent = path.parent
    if parent.name == PRIVATE_DIR:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(parent, 0o700)
        legacy = parent.parent / path.name
        if legacy.exists() and not path.exists():
            for suffix in ("", *SQLITE_SIDE_FILES):
                old = Path(f"{legacy}{suffix}")
                if old.exists():
                    os.replace(old, f"{path}{suffix}")
            log.info("moved the database from %s to %s", legacy, path)
    else:
        parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for suffix in ("", *SQLITE_SIDE_FILES):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)


def create_database(raw_url: str, *, migrate: bool = True) -> Database:
    """Open the database and bring its schema up to date (``migrate=False``: as it is)."""
    from shellbox.store.migrate import upgrade

    url = check_url(raw_url)
    if url.drivername in SQLITE_DRIVERS:
        memory = url.database in (None, "", ":memory:")
        if not memory:
            secure_sqlite_files(Path(url.database or ""))
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
    try:
        if migrate:
            upgrade(engine)
        else:
            engine.connect().close()
    except OperationalError as exc:
        engine.dispose()
        msg = f"cannot open the database at {url.render_as_string(hide_password=True)}: {exc.orig}"
        raise InvalidRequest(msg, param="database_url") from None
    return Database(engine)
