"""The metadata store: SQLite by default (WAL, in the state directory), URL checks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import insert, text

from shellbox.errors import InvalidRequest
from shellbox.settings import Settings
from shellbox.store import create_database
from shellbox.store.tables import files


def _add_files(db, n: int, project: str = "p") -> list[str]:
    ids = [f"file-{i:03d}" for i in range(n)]
    with db.begin() as conn:
        for fid in ids:
            conn.execute(
                insert(files).values(
                    id=fid,
                    project=project,
                    filename="f",
                    purpose="user_data",
                    bytes=1,
                    created_at=0,
                )
            )
    return ids


def test_sqlite_default_path_wal_and_persistence(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state")
    url = settings.database_url()
    assert url == f"sqlite:///{tmp_path / 'state' / 'private' / 'shellbox.db'}"
    db = create_database(url)  # creates the parent directory and the tables
    with db.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    ids = _add_files(db, 5)
    db.dispose()
    again = create_database(url)
    page = again.page(files, [files.c.project == "p"], after=None, limit=10, order="asc")
    assert [r["id"] for r in page.rows] == ids and not page.has_more
    again.dispose()


def test_sqlite_files_are_for_root_only(tmp_path: Path) -> None:
    """The database, its WAL and shared memory 0600 from their first byte, in a 0700
    directory (the state directory itself must stay traversable for the containers)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o711)
    settings = Settings(state_dir=state)
    db = create_database(settings.database_url())
    _add_files(db, 3)
    private = state / "private"
    files_made = sorted(p.name for p in private.iterdir())
    assert files_made == ["shellbox.db", "shellbox.db-shm", "shellbox.db-wal"], files_made
    for p in private.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    assert private.stat().st_mode & 0o777 == 0o700
    db.dispose()


def test_a_database_at_the_old_default_path_is_moved_in(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = create_database(f"sqlite:///{state / 'shellbox.db'}")
    ids = _add_files(old, 2)  # left in the WAL: the WAL must move along
    assert (state / "shellbox.db-wal").stat().st_size > 0
    with old.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        (state / "shellbox.db").chmod(0o644)
        moved = create_database(Settings(state_dir=state).database_url())
        page = moved.page(files, [files.c.project == "p"], after=None, limit=10, order="asc")
    assert [r["id"] for r in page.rows] == ids
    assert not (state / "shellbox.db").exists()
    assert (state / "private" / "shellbox.db").stat().st_mode & 0o777 == 0o600
    moved.dispose()
    old.dispose()


def test_page_cursor_rules() -> None:
    db = create_database("sqlite://")
    ids = _add_files(db, 7)
    with db.begin() as conn:
        conn.execute(
            insert(files).values(
                id="file-x", project="q", filename="f", purpose="user_data", bytes=1, created_at=0
            )
        )
    where = [files.c.project == "p"]
    first = db.page(files, where, after=None, limit=3, order="asc")
    assert [r["id"] for r in first.rows] == ids[:3] and first.has_more
    second = db.page(files, where, after=ids[2], limit=3, order="asc")
    assert [r["id"] for r in second.rows] == ids[3:6] and second.has_more
    last = db.page(files, where, after=ids[5], limit=3, order="asc")
    assert [r["id"] for r in last.rows] == ids[6:] and not last.has_more
    desc = db.page(files, where, after=ids[4], limit=10, order="desc")
    assert [r["id"] for r in desc.rows] == ids[:4][::-1]
    # A cursor from another project (or unknown) does not leak its position.
    assert [
        r["id"] for r in db.page(files, where, after="file-x", limit=2, order="asc").rows
    ] == ids[:2]


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("mysql://u:p@h/db", "'mysql' driver is not supported"),
        ("postgresql+psycopg2://u:p@h/db", "'postgresql+psycopg2' driver is not supported"),
        ("not a url", "is not a database URL"),
    ],
)
def test_bad_urls_say_what_to_use(url: str, needle: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        create_database(url)
    assert needle in exc.value.message
    assert "postgresql+psycopg://" in exc.value.message and "sqlite:///" in exc.value.message
    assert exc.value.param == "database_url"


def test_postgresql_url_is_accepted_and_needs_psycopg() -> None:
    url = "postgresql+psycopg://shellbox:secret@127.0.0.1:1/shellbox"
    assert Settings(store={"database_url": url}).database_url() == url
    with pytest.raises(InvalidRequest) as exc:
        create_database(url)
    if importlib.util.find_spec("psycopg") is None:
        assert "pip install 'shellbox[postgres]'" in exc.value.message
    else:  # nothing listens on port 1: a clear message, without the password
        assert "cannot open the database" in exc.value.message
        assert "secret" not in exc.value.message


def test_settings_refuse_other_schemes() -> None:
    with pytest.raises(ValidationError) as exc:
        Settings(store={"database_url": "mysql://x"})
    assert "store.database_url must be sqlite:///... or postgresql+psycopg://" in str(exc.value)


def test_serve_with_a_bad_url_exits_with_a_clear_message(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "shellbox.cli",
            "serve",
            "--state-dir",
            str(tmp_path),
            "--database-url",
            "mysql://u@h/db",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "store.database_url" in proc.stderr and "Traceback" not in proc.stderr
