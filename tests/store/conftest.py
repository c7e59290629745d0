"""The store contract suite runs every repository against SQLite and a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shellbox.store import Database, Stores, create_database, create_stores


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'private' / 'shellbox.db'}"
    return str(request.getfixturevalue("pg_cluster").new_database())


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = create_database(database_url)
    yield database
    database.dispose()


@pytest.fixture
def stores(db: Database) -> Stores:
    return create_stores(db)
