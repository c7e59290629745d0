"""sandbox_usage and admin_keys: metered sandbox time per request, and the keys that may read
the organization's usage, costs and /metrics (issue 14).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sandbox_usage",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), unique=True, nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("api_key_id", sa.String(64), nullable=True),
        sa.Column("container_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("started_at_ms", sa.BigInteger, nullable=False),
        sa.Column("ended_at_ms", sa.BigInteger, nullable=False),
        sa.Column("measured_ms", sa.BigInteger, nullable=False),
        sa.Column("billed_ms", sa.BigInteger, nullable=False),
        sa.Column("started_container", sa.Boolean, nullable=False),
    )
    op.create_index("ix_sandbox_usage_ended", "sandbox_usage", ["ended_at_ms", "project"])
    op.create_table(
        "admin_keys",
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("admin_keys")
    op.drop_index("ix_sandbox_usage_ended", table_name="sandbox_usage")
    op.drop_table("sandbox_usage")
