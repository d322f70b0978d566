"""Leases get an epoch (a reap or re-lease increments it; a settling write checks it) and a start time (a deadline).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_leases", sa.Column("epoch", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("tuner_leases", sa.Column("started_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_leases") as batch:
        batch.drop_column("epoch")
        batch.drop_column("started_at")
