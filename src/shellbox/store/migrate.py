"""Schema migrations (Alembic): ``shellbox db upgrade``, and at every start-up.

The scripts live in ``store/migrations/versions`` and ship in the package. A database made by
shellbox before migrations existed (``create_all``, no ``alembic_version`` table) is adopted:
the first migration creates only the tables it lacks and keeps every row."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text

log = logging.getLogger("shellbox.store")
SCRIPTS = Path(__file__).with_name("migrations")
# Servers starting together on one PostgreSQL database migrate one at a time.
LOCK_KEY = int.from_bytes(hashlib.sha256(b"shellbox-migrations").digest()[:8], "big", signed=True)


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    return config


def head() -> str:
    """The newest revision this shellbox knows."""
    revision = ScriptDirectory.from_config(_config()).get_current_head()
    assert revision is not None
    return revision


def current(engine: Engine) -> str | None:
    """The revision the database is at (None: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database to ``revision``, in one transaction that first takes a lock
    (PostgreSQL: an advisory lock; SQLite: the write lock), so that two servers starting at
    once migrate one after the other: the second finds the work done."""
    config = _config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        before = MigrationContext.configure(conn).get_current_revision()
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        after = MigrationContext.configure(conn).get_current_revision()
    if before != after:
        log.info("database schema migrated from %s to %s", before or "nothing", after)
