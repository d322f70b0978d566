"""Studies get a unique id (their trial folders are keyed by it); stored study files lose their passwords.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import uuid

import sqlalchemy as sa
from alembic import op

from tuner.store.urls import mask_credentials

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

studies = sa.table("tuner_studies", sa.column("name", sa.String), sa.column("spec_text", sa.Text), sa.column("uid", sa.String))


def upgrade() -> None:
    op.add_column("tuner_studies", sa.Column("uid", sa.String(32), nullable=True))
    conn = op.get_bind()
    for name, spec_text in conn.execute(sa.select(studies.c.name, studies.c.spec_text)).all():
        conn.execute(studies.update().where(studies.c.name == name).values(uid=uuid.uuid4().hex, spec_text=mask_credentials(spec_text)))
    with op.batch_alter_table("tuner_studies") as batch:
        batch.alter_column("uid", existing_type=sa.String(32), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("tuner_studies") as batch:
        batch.drop_column("uid")
