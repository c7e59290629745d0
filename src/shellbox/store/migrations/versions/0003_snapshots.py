"""snapshots: containers' saved disks, a project's resource that outlives its container.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshots",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), unique=True, nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("container_id", sa.String(64), nullable=False),
        sa.Column("name", sa.Text, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("last_used_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_snapshots_project", "snapshots", ["project"])


def downgrade() -> None:
    op.drop_index("ix_snapshots_project", table_name="snapshots")
    op.drop_table("snapshots")
