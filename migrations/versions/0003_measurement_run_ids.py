"""Measurements get a unique run id: a retried insert of the same timing run adds nothing.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tuner_measurements", sa.Column("run_id", sa.String(64), nullable=True))
    op.create_index("ix_tuner_measurements_run_id", "tuner_measurements", ["run_id"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_tuner_measurements_run_id", "tuner_measurements")
    with op.batch_alter_table("tuner_measurements") as batch:
        batch.drop_column("run_id")
