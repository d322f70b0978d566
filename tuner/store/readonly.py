"""Look at a storage without writing to it: read-only commands (`status`, `best`, `report`, `dashboard`) ask here first.

Opening Optuna's `RDBStorage` creates its tables (and, for SQLite, the file); its version manager writes
a version row and an Alembic stamp where they are missing. So a read-only command first checks, by
inspection alone, that Optuna's schema is there, and then opens the storage with table creation off.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from tuner.store.db import check_reachable, get_engine

OPTUNA_TABLES = ("studies", "version_info", "alembic_version")  # what RDBStorage would otherwise create or stamp


def sqlite_file_missing(url: str) -> bool:
    """Whether `url` is SQLite and its database file does not exist (connecting would create it)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite":
        return False
    return not u.database or u.database == ":memory:" or not Path(u.database).exists()


def has_optuna_schema(url: str) -> bool:
    """Whether Optuna's tables exist in the database at `url`; creates nothing (TunerError if unreachable)."""
    if sqlite_file_missing(url):
        return False
    check_reachable(url)
    with get_engine(url).connect() as conn:
        tables = set(inspect(conn).get_table_names())
    return all(name in tables for name in OPTUNA_TABLES)
