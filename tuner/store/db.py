"""Database access: engines sized for the workers, schema migration, the database clock, study locks."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError, SQLAlchemyError
from tenacity import Retrying, retry_if_exception, stop_after_delay, stop_never, wait_exponential

from tuner.errors import TunerError, first_line
from tuner.store.urls import mask_url, scrub

VERSION_TABLE = "tuner_alembic_version"
log = logging.getLogger("tuner.store")
F = TypeVar("F", bound=Callable[..., Any])


def is_db_fault(exc: BaseException) -> bool:
    """Whether `exc` means the database is (temporarily) unreachable rather than a bug."""
    import optuna

    return isinstance(exc, OperationalError | DBAPIError | optuna.exceptions.StorageInternalError | InvalidatePoolError)


RETRY_CAP_S = 10.0  # the longest wait between two attempts while the database is away


class Outage:
    """This process's view of the database connection, so an outage is announced once and its end too.

    Thread-safe (the heartbeat thread reports too); never used from a signal handler.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None  # monotonic time of the first failure of the current outage
        self.ended_at = -math.inf  # monotonic time the last outage ended

    def failed(self, exc: BaseException | None) -> None:
        """An operation failed because the database is away."""
        with self._lock:
            if self.since is None:
                self.since = time.monotonic()
                log.warning("database unreachable (%s); waiting for it, however long, retrying every <= %g s",
                            type(exc).__name__, RETRY_CAP_S)

    def recovered(self) -> None:
        """An operation succeeded: if an outage was on, it is over."""
        with self._lock:
            if self.since is not None:
                log.warning("database back after %.0f s; carrying on", time.monotonic() - self.since)
                self.since = None
                self.ended_at = time.monotonic()

    def recent(self, window_s: float) -> bool:
        """Whether an outage is on or ended less than `window_s` ago (others' heartbeats may still be stale)."""
        with self._lock:
            return self.since is not None or time.monotonic() - self.ended_at < window_s


OUTAGE = Outage()
STOP = threading.Event()  # set by a worker's stop handler: waiting for the database ends, the last error is raised


class _Retrying(Retrying):
    """Retrying that reports the end of an outage once the retried block succeeds."""

    def __iter__(self) -> Iterator[Any]:
        yield from super().__iter__()
        OUTAGE.recovered()


def db_retry(max_wait_s: float | None = None) -> Retrying:
    """Retry a database operation with capped exponential backoff while the database is away.

    By default it waits out an outage of any length (one status line when it starts, one when it
    ends); `max_wait_s` bounds the wait, and `STOP` ends it (the last error is re-raised).
    """
    stop: Any = stop_never if max_wait_s is None else stop_after_delay(max_wait_s)
    return _Retrying(
        retry=retry_if_exception(is_db_fault), wait=wait_exponential(multiplier=0.5, max=RETRY_CAP_S),
        stop=stop | (lambda rs: STOP.is_set()), reraise=True, sleep=STOP.wait,
        before_sleep=lambda rs: OUTAGE.failed(rs.outcome.exception() if rs.outcome else None),
    )


def retried(fn: F) -> F:
    """Decorator: run `fn` under `db_retry()` (for short, idempotent database operations)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for attempt in db_retry():
            with attempt:
                value = fn(*args, **kwargs)
        return value

    return wrapper  # type: ignore[return-value]


def engine_kwargs(url: str) -> dict:
    """Engine options for our tables and Optuna's: pre-ping and recycling; SQLite waits for locks."""
    if make_url(url).get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 120}}
    return {"pool_pre_ping": True, "pool_recycle": 300, "pool_size": 2, "max_overflow": 4, "connect_args": {"connect_timeout": 10}}


@cache
def get_engine(url: str) -> Engine:
    """One engine per URL and process."""
    try:
        return create_engine(url, **engine_kwargs(url))
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise TunerError(f"storage {mask_url(url)}: not a usable database URL ({first_line(scrub(str(exc), url))})") from exc


def check_reachable(url: str) -> None:
    """Raise a one-line TunerError unless the database answers."""
    try:
        with get_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        reason = first_line(scrub(str(exc.orig or exc), url))
        raise TunerError(f"storage {mask_url(url)}: cannot connect ({reason})") from exc


def _script_location() -> str:
    """The migrations folder: installed as `tuner.migrations`, or `migrations/` beside `tuner/` in a checkout."""
    try:
        return str(resources.files("tuner.migrations"))
    except ModuleNotFoundError:
        return str(Path(__file__).resolve().parents[2] / "migrations")


def _alembic_config(connection: object) -> object:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    cfg.attributes["connection"] = connection
    return cfg


def current_revision(url: str) -> str | None:
    """Our schema's revision in the database, or None before the first migration."""
    engine = get_engine(url)
    with engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()


def head_revision() -> str:
    """The newest revision this code knows."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(_script_location()).get_current_head() or ""


def upgrade_schema(url: str) -> tuple[str | None, str]:
    """Migrate our tables to head (refusing a schema newer than this code); returns (before, after)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    before = current_revision(url)
    known = {s.revision for s in ScriptDirectory(_script_location()).walk_revisions()}
    if before is not None and before not in known:
        raise TunerError(
            f"storage {mask_url(url)}: its tuner schema is at revision {before}, newer than this route-tuner knows "
            f"(head {head_revision()}); upgrade route-tuner on this machine"
        )
    if before != head_revision():
        engine = get_engine(url)
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")  # type: ignore[arg-type]
    return before, head_revision()


def ensure_schema(url: str) -> None:
    """Create or migrate our tables as needed before a run (an empty database is set up here)."""
    upgrade_schema(url)


def db_epoch(conn: object) -> float:
    """Seconds since the epoch by the database's clock (one clock for every host of a study)."""
    bind = conn.get_bind() if hasattr(conn, "get_bind") else conn
    dialect = bind.dialect.name  # type: ignore[attr-defined]
    sql = "SELECT extract(epoch from clock_timestamp())" if dialect == "postgresql" else "SELECT (julianday('now') - 2440587.5) * 86400.0"
    return float(conn.execute(text(sql)).scalar())  # type: ignore[attr-defined]


@contextlib.contextmanager
def study_lock(url: str, study: str) -> Iterator[None]:
    """An exclusive lock per study across processes and hosts.

    PostgreSQL: a session advisory lock (released by the server if the holder dies). SQLite (one host):
    an flock on a file beside the database.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        key = int.from_bytes(hashlib.sha256(f"route-tuner:{study}".encode()).digest()[:8], "big", signed=True)
        with get_engine(url).connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
        return
    database = parsed.database or ""
    lock_path = Path(f"{database}.{study}.lock") if database and database != ":memory:" else Path(f"/tmp/route-tuner-{study}.lock")
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
