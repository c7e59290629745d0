"""The egress feature's tables, on the shared ``metadata`` (created with the others)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Integer, String, Table, Text

from shellbox.store.tables import metadata

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
