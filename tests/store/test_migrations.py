"""Alembic migrations: they make the schema ``store/tables.py`` describes, adopt a database
made by ``create_all`` before migrations existed without losing a row, and run from the CLI."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, func, inspect, select, text

from shellbox.settings import Settings
from shellbox.store import create_database, create_stores
from shellbox.store.migrate import current, head, upgrade
from shellbox.store.tables import metadata

LEGACY = Path(__file__).parent / "data" / "shellbox-0.1.db"
LEGACY_KEY = "sk-shellbox-k6OqVOkohYDzxL-iBC1JlozuYVIcO9lqNurA0zB5n4A"


def test_the_migrations_make_exactly_the_tables_module(database_url: str) -> None:
    db = create_database(database_url)
    try:
        assert current(db.engine) == head()
        with db.engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
        assert diff == []
        names = set(inspect(db.engine).get_table_names())
        assert names == {*metadata.tables, "alembic_version"}
    finally:
        db.dispose()


def test_servers_starting_together_migrate_once(database_url: str, tmp_path: Path) -> None:
    """Three processes upgrade one empty database at once: all succeed, and it ends at the
    head (each takes the lock, the later ones find the work done)."""
    argv = [sys.executable, "-m", "shellbox.cli", "db", "upgrade", "--database-url", database_url]
    argv += ["--state-dir", str(tmp_path / "state")]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)
    ]
    results = [(p.wait(60), p.stderr.read().decode() if p.stderr else "") for p in procs]
    for p in procs:
        for stream in (p.stdout, p.stderr):
            if stream:
                stream.close()
    assert [code for code, _ in results] == [0, 0, 0], results
    engine = create_engine(database_url)
    try:
        assert current(engine) == head()
        upgrade(engine)  # and again: nothing to do
        assert current(engine) == head()
    finally:
        engine.dispose()


def test_a_database_made_by_create_all_is_adopted_with_its_rows(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "private").mkdir(parents=True)
    shutil.copy(LEGACY, state / "private" / "shellbox.db")
    url = Settings(state_dir=state).database_url()
    before = _row_counts(url)
    assert before and all(n >= 1 for n in before.values()), before

    db = create_database(url)  # what every start-up does
    try:
        assert current(db.engine) == head()
        after = _row_counts(url)
        assert {n: after[n] for n in before} == before  # every row kept
        assert set(after) == set(metadata.tables)  # and the later migrations' tables added
        stores = create_stores(db)
        match = stores.keys.by_hash(hashlib.sha256(LEGACY_KEY.encode()).hexdigest())
        assert match is not None and match.project == "legacy"
        old = stores.containers.get("legacy", "cntr_legacy1")
        assert old is not None and old.skills[0]["skill_id"] == "skill_legacy"
        assert stores.skills.resolve("legacy", "skill_legacy", None, param="v").version == 1
        assert stores.idempotency.get("legacy", "k1", expired_before=0) is not None
        assert stores.responses.get("legacy", "resp_legacy") is not None
        assert [r.id for r in stores.container_files.for_container("cntr_legacy1")] == [
            "cfile_legacy"
        ]
        # and it keeps working: new rows next to the old ones
        stores.keys.insert(
            type(stores.keys.list()[0])("key_new", "p", "sk-shellbox-x", 1, None), "hash"
        )
        assert len(stores.keys.list()) == 2
    finally:
        db.dispose()


def _row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            names = [n for n in inspect(conn).get_table_names() if n != "alembic_version"]
            return {
                n: conn.execute(select(func.count()).select_from(text(n))).scalar_one()
                for n in names
            }
    finally:
        engine.dispose()


def test_db_upgrade_command(database_url: str, tmp_path: Path) -> None:
    def shellbox(*args: str) -> str:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "shellbox.cli",
                "db",
                *args,
                "--state-dir",
                str(tmp_path / "state"),
                "--database-url",
                database_url,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    assert shellbox("current") == f"none (newest: {head()})"
    assert shellbox("upgrade") == f"database migrated from nothing to revision {head()} " + (
        f"(newest: {head()})"
    )
    assert shellbox("upgrade") == f"database already at revision {head()} (newest: {head()})"
    assert shellbox("current") == f"{head()} (newest: {head()})"
