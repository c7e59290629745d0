"""Table definitions: the single source for SQLite and PostgreSQL.

Every listed object has an integer ``seq`` (creation order, the cursor key) and a string
``id`` (what the API shows). Every table of every feature is here, and nowhere else: the
migrations in ``store/migrations`` create them (a test checks that they agree).
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    LargeBinary,
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
    # The snapshot it was forked from (migration 0005): while a live container names it, a
    # snapshot deleted from the API still counts against its project's snapshot bytes.
    Column("snapshot_id", String(64), nullable=True, index=True),
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

# -- skills -----------------------------------------------------------------------------------
# A skill's ``name`` and ``description`` are its default version's (copied when the default
# moves). Version numbers come from ``next_version`` and are never reused, so a number always
# names the same bytes even after its version was deleted.

skills = Table(
    "skills",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("default_version", Integer, nullable=False),
    Column("latest_version", Integer, nullable=False),
    Column("next_version", Integer, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

skill_versions = Table(
    "skill_versions",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("skill_id", String(64), nullable=False, index=True),
    Column("project", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("name", Text, nullable=False),
    Column("description", Text, nullable=False),
    Column("files", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),  # unpacked
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("skill_id", "version", name="uq_skill_versions_version"),
)

# -- egress -----------------------------------------------------------------------------------

# Which network slot (namespace, addresses) each allowlisted container holds.
egress_slots = Table(
    "egress_slots",
    metadata,
    Column("container_id", String(64), primary_key=True),
    Column("slot", Integer, nullable=False, unique=True),
    Column("created_at", BigInteger, nullable=False),
)

# One row per egress attempt through the proxy. Never headers, bodies, query strings or
# secrets: only what is needed to see where a container tried to go.
egress_events = Table(
    "egress_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("container_id", String(64), nullable=False, index=True),
    Column("created_at", BigInteger, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("method", String(16), nullable=False),
    Column("scheme", String(8), nullable=False),
    Column("host", Text, nullable=False),
    Column("port", Integer, nullable=False),
    Column("path", Text, nullable=False),
    Column("decision", String(8), nullable=False),  # allowed | refused
    Column("reason", Text, nullable=True),
    Column("status", Integer, nullable=True),
    Column("request_bytes", BigInteger, nullable=False),
    Column("response_bytes", BigInteger, nullable=False),
)

# -- responses --------------------------------------------------------------------------------

responses = Table(
    "responses",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("created_at", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("container_id", String(64), nullable=True),
    Column("body", JSON, nullable=False),  # the Response object, as the API shows it
    # Input and output items of the whole chain up to this response (instructions and tools
    # are not carried over, as in the OpenAI API).
    Column("conversation", JSON, nullable=False),
)

# -- idempotency ------------------------------------------------------------------------------

MAX_IDEMPOTENCY_KEY_LENGTH = 255  # must match service/idempotency.py

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("project", String(128), primary_key=True),
    Column("key", String(MAX_IDEMPOTENCY_KEY_LENGTH), primary_key=True),
    Column("route", Text, nullable=False),  # ids in the path have no length cap
    Column("fingerprint", String(64), nullable=False),
    Column("state", String(16), nullable=False),  # in_progress | done
    Column("run", String(32), nullable=False),  # the process that claimed it
    Column("resource_id", String(64), nullable=True),  # what the first attempt started
    Column("status", Integer, nullable=True),
    Column("content_type", String(128), nullable=True),
    Column("body", LargeBinary, nullable=True),
    Column("created_at", BigInteger, nullable=False),
)

# Server processes that claim idempotency keys, with when each was last seen alive: another
# server's claim is only taken over once its process has stopped reporting (migration 0002).
server_runs = Table(
    "server_runs",
    metadata,
    Column("run", String(32), primary_key=True),
    Column("seen_at", BigInteger, nullable=False),
)

# -- snapshots --------------------------------------------------------------------------------
# A container's saved disk (migration 0003). It outlives its container; ``bytes`` is what the
# container's disk held when it was taken; ``last_used_at`` moves when a fork is made from it.
# ``deleted_at`` (migration 0005): deleted from the API (or expired) while forks of it lived;
# the row stays, hidden, so its bytes count until the last of them is gone.

snapshots = Table(
    "snapshots",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("container_id", String(64), nullable=False),
    Column("name", Text, nullable=True),
    Column("status", String(16), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("last_used_at", BigInteger, nullable=False),
    Column("deleted_at", BigInteger, nullable=True),
)

# -- metering and admin keys (issue 14) -------------------------------------------------------
# Made by migration 0004.

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

# -- many machines (issue 15) -----------------------------------------------------------------
# Made by migration 0005.

# Sandbox nodes (``shellbox node``): what each registered, and when it last said it was alive.
# A node whose ``heartbeat_at_ms`` is older than ``cluster.node_timeout_s`` is lost; ``state``
# is ``up`` from registration until a clean stop makes it ``stopped``.
nodes = Table(
    "nodes",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("url", Text, nullable=False),  # where API replicas reach it
    Column("state", String(16), nullable=False),  # up | stopped
    Column("memory_bytes", BigInteger, nullable=False),  # what its containers may hold in all
    Column("containers", Integer, nullable=False),  # what it holds, as it last said
    Column("info", JSON, nullable=False),  # its RuntimeInfo (image, cgroup, disk quota)
    Column("registered_at_ms", BigInteger, nullable=False),
    Column("heartbeat_at_ms", BigInteger, nullable=False),
)

# Which node holds each container and snapshot (the API role's routing table). Written when
# the sandbox is placed, before the container's own row exists (creation inserts that row once
# the sandbox is made), and removed when it is destroyed. A container never moves.
placements = Table(
    "placements",
    metadata,
    Column("id", String(64), primary_key=True),  # a container or snapshot id
    Column("kind", String(16), nullable=False),  # container | snapshot
    Column("node", String(128), nullable=False, index=True),
    Column("memory_bytes", BigInteger, nullable=False),  # its memory_limit (snapshots: 0)
    Column("created_at_ms", BigInteger, nullable=False),
)

# Background work that must run on one process at a time (the reaper of API replicas): held by
# ``holder`` until ``expires_at_ms``, renewed by it each round, taken over once it lapses.
leases = Table(
    "leases",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(64), nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
)

# Bytes that every API replica must reach (Files API blobs, skill bundles) when they live in
# the database: cut in chunks, so neither a write nor a read holds more than one in memory.
blob_chunks = Table(
    "blob_chunks",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("n", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)
