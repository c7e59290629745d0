"""Metadata storage: SQLAlchemy Core over SQLite (WAL) by default, PostgreSQL by URL."""

from shellbox.store.db import Database, create_database

__all__ = ["Database", "create_database"]
