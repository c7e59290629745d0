"""snapshot retention: which snapshot a container was forked from, and snapshots deleted from
the API whose bytes still count while forks of them live.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("containers") as batch:
        batch.add_column(sa.Column("snapshot_id", sa.String(64), nullable=True))
    op.create_index("ix_containers_snapshot_id", "containers", ["snapshot_id"])
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("deleted_at", sa.BigInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("deleted_at")
    op.drop_index("ix_containers_snapshot_id", table_name="containers")
    with op.batch_alter_table("containers") as batch:
        batch.drop_column("snapshot_id")
