"""Alembic environment: the tuner's tables, with their own version table beside Optuna's `alembic_version`."""

from alembic import context

from tuner.store.models import Base

VERSION_TABLE = "tuner_alembic_version"

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
