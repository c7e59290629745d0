"""nodes, placements, leases and blob_chunks: sandbox nodes and the API replicas that place
containers on them, run background work once, and share uploaded bytes (issue 15).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("containers", sa.Integer, nullable=False),
        sa.Column("info", sa.JSON, nullable=False),
        sa.Column("registered_at_ms", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "placements",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("node", sa.String(128), nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at_ms", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_placements_node", "placements", ["node"])
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(64), nullable=False),
        sa.Column("expires_at_ms", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "blob_chunks",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("n", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("blob_chunks")
    op.drop_table("leases")
    op.drop_index("ix_placements_node", table_name="placements")
    op.drop_table("placements")
    op.drop_table("nodes")
