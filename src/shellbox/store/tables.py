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

# -- metering and admin keys (issue 14) -------------------------------------------------------
# Created by create_all like the tables above until the lead's Alembic migration adds them.

# One row per request that ran sandbox commands, written in the transaction that completes the
# request (with the stored response, when there is one). ``id`` is the request's own id
# (response, message or call): unique, so a request is never billed twice.
sandbox_usage = Table(
    "sandbox_usage",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False),
    Column("api_key_id", String(64), nullable=True),
    Column("container_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),  # responses | messages | call
    Column("started_at_ms", BigInteger, nullable=False),  # the first command's start
    Column("ended_at_ms", BigInteger, nullable=False),  # when the request completed
    Column("measured_ms", BigInteger, nullable=False),
    Column("billed_ms", BigInteger, nullable=False),  # measured, or the minimum
    Column("started_container", Boolean, nullable=False),  # created or woke it: the minimum
)
Index("ix_sandbox_usage_ended", sandbox_usage.c.ended_at_ms, sandbox_usage.c.project)

# Keys that may read organization usage and costs and /metrics (``shellbox keys create
# --admin``): a grant per api_keys row, so existing databases need no column added.
admin_keys = Table(
    "admin_keys",
    metadata,
    Column("key_id", String(64), primary_key=True),
    Column("created_at", BigInteger, nullable=False),
)
# -- end of metering and admin keys -------------------------------------------------------------
