"""server_runs: which server processes are alive, for idempotency claims across servers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "server_runs",
        sa.Column("run", sa.String(32), primary_key=True),
        sa.Column("seen_at", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("server_runs")
