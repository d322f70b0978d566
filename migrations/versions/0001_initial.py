"""Initial tuner tables: environments, results (build cache), measurements, artifacts, leases, studies.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuner_environments",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "tuner_results",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("backend_version", sa.String(64), nullable=False),
        sa.Column("environment_id", sa.String(64), nullable=False),
        sa.Column("route", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("accuracy", sa.Float(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("artifact_sha256", sa.String(64), nullable=True),
        sa.Column("study", sa.String(128), nullable=False),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "tuner_measurements",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("study", sa.String(128), nullable=False, index=True),
        sa.Column("trial_number", sa.Integer(), nullable=False),
        sa.Column("result_key", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("samples_ms", sa.JSON(), nullable=False),
        sa.Column("timing_info", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "tuner_artifacts",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "tuner_leases",
        sa.Column("trial_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("study", sa.String(128), nullable=False, index=True),
        sa.Column("worker", sa.String(128), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
    )
    op.create_table(
        "tuner_studies",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("spec_text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    for table in ("tuner_studies", "tuner_leases", "tuner_artifacts", "tuner_measurements", "tuner_results", "tuner_environments"):
        op.drop_table(table)
