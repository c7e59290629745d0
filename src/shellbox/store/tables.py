"""Table definitions: the single source for SQLite and PostgreSQL.

Every listed object has an integer ``seq`` (creation order, the cursor key) and a string
``id`` (what the API shows). Feature modules add their own tables to ``metadata``.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

api_keys = Table(
    "api_keys",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False),
    Column("key_hash", String(128), unique=True, nullable=False),
    Column("prefix", String(32), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("revoked_at", BigInteger, nullable=True),
)

containers = Table(
    "containers",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("name", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("last_active_at", BigInteger, nullable=False),
    Column("expires_after_minutes", Integer, nullable=False),
    Column("memory_limit", String(8), nullable=False),
    Column("network_policy", JSON, nullable=False),  # public part only: never secrets
    Column("secrets", JSON, nullable=True),  # domain_secrets values; never leave the server
    Column("skills", JSON, nullable=True),  # what is mounted (see service/skills)
    Column("deleted", Boolean, nullable=False, default=False),
)
Index("ix_containers_project_name", containers.c.project, containers.c.name)

files = Table(
    "files",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("filename", Text, nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("expires_at", BigInteger, nullable=True),
)

container_files = Table(
    "container_files",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("container_id", String(64), nullable=False, index=True),
    Column("path", Text, nullable=False),  # relative to /mnt/data
    Column("bytes", BigInteger, nullable=False),
    Column("mtime_ns", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("source", String(16), nullable=False),
    UniqueConstraint("container_id", "path", name="uq_container_files_path"),
)
