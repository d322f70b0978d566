"""Alembic migrations of the tuner's own tables (installed as `tuner.migrations`)."""
