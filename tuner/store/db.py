"""Database access: engines with bounded waits, schema migration, the database clock, study and schema locks."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, create_engine, inspect, literal_column, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, OperationalError, SQLAlchemyError
from tenacity import Retrying, retry_if_exception, stop_after_delay, stop_never, wait_exponential

from tuner.errors import TunerError, Unavailable, first_line
from tuner.store.urls import mask_url, scrub

VERSION_TABLE = "tuner_alembic_version"
SCHEMA_LOCK = "route-tuner/schema"  # not a study lock name: study names cannot contain '/'
TIMEOUTS_ENV = "TUNER_PG_TIMEOUTS"
# Lifted for a schema migration (it may rewrite large tables, with Python work between statements; it holds the schema
# lock, kept alive, and runs on its own connection): the server ends no such statement or transaction
MIGRATION_UNBOUNDED = ("statement_timeout", "idle_in_transaction_session_timeout")
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
                log.warning(
                    "database unreachable (%s); waiting for it, however long, retrying every <= %g s",
                    type(exc).__name__,
                    RETRY_CAP_S,
                )

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


class StopEvent(threading.Event):
    """A process's stop, remembering when it was first set (a database wait may go on a little after it)."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        super().set()


STOP = StopEvent()  # set by a stop handler: waiting for the database ends, the last error is raised
STOP_GRACE_S = 5.0  # after a stop, how long a database wait may still take (a frozen server never answers)
WAIT_TICK_S = 0.5  # how often a waiting connection looks at STOP


def wait_stoppable(conn: Any) -> None:
    """psycopg2's wait callback: libpq waits in `select`, so signal handlers run meanwhile (as in
    `psycopg2.extras.wait_select`), and a wait gives up `STOP_GRACE_S` after `STOP` (an `OperationalError`).

    Unlike `wait_select` it sends no cancel request on Ctrl-C: cancelling opens a new connection to
    the server and waits for its answer, which a frozen server never gives. The interrupt propagates.
    """
    import select

    import psycopg2
    from psycopg2.extensions import POLL_OK, POLL_READ, POLL_WRITE

    while True:
        state = conn.poll()
        if state == POLL_OK:
            return
        if state not in (POLL_READ, POLL_WRITE):
            raise psycopg2.OperationalError(f"bad state from poll: {state}")
        fd = [conn.fileno()]
        select.select(fd if state == POLL_READ else [], fd if state == POLL_WRITE else [], [], WAIT_TICK_S)
        if STOP.at is not None and time.monotonic() - STOP.at > STOP_GRACE_S:
            raise psycopg2.OperationalError("stopped while waiting for the database")


@cache
def _wait_in_python() -> None:
    """Install `wait_stoppable` for every psycopg2 connection of this process (once)."""
    import psycopg2.extensions

    psycopg2.extensions.set_wait_callback(wait_stoppable)


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
        retry=retry_if_exception(is_db_fault),
        wait=wait_exponential(multiplier=0.5, max=RETRY_CAP_S),
        stop=stop | (lambda rs: STOP.is_set()),
        reraise=True,
        sleep=STOP.wait,
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


@dataclass(frozen=True)
class PgTimeouts:
    """Bounds on how long a PostgreSQL connection may wait, so one stuck or partitioned host stalls no other.

    `statement_s`/`lock_s`: the longest statement and lock wait; `idle_tx_s`: a session idle inside a
    transaction is ended by the server (every transaction of ours and Optuna's is a few statements with no other
    work between them, so such a session is a frozen or partitioned process; shorter than `lock_s`, so a
    waiter for the row locks it held gets them before its own wait gives up); `keepalive_*`: TCP keepalives on
    both ends (the server drops a partitioned client's session, releasing its advisory locks, in about idle +
    interval * count seconds);
    `lock_hold_s`: a session holding a study or schema lock while idle that long is ended by the server
    (a frozen holder). Override with `$TUNER_PG_TIMEOUTS`, e.g. `lock_hold_s=300,statement_s=600`.
    """

    statement_s: float = 300.0
    lock_s: float = 60.0
    idle_tx_s: float = 30.0
    keepalive_idle_s: int = 30
    keepalive_interval_s: int = 10
    keepalive_count: int = 3
    lock_hold_s: float = 120.0

    @classmethod
    def from_env(cls) -> PgTimeouts:
        """The defaults, overridden by `$TUNER_PG_TIMEOUTS` (comma-separated name=seconds)."""
        raw = os.environ.get(TIMEOUTS_ENV, "").strip()
        if not raw:
            return cls()
        values: dict[str, Any] = {}
        names = {f.name: f.type for f in fields(cls)}
        for item in raw.split(","):
            name, _, value = item.partition("=")
            name = name.strip()
            try:
                if name not in names:
                    raise ValueError
                values[name] = int(value) if names[name] == "int" else float(value)
                if values[name] <= 0:
                    raise ValueError
            except ValueError:
                raise TunerError(
                    f"${TIMEOUTS_ENV}: {item.strip()!r}: expected name=positive number, names: {', '.join(names)}"
                ) from None
        return cls(**values)

    def connect_args(self, migration: bool = False) -> dict[str, Any]:
        """libpq connection parameters: client keepalives and the server-side session limits (for a `migration`,
        those of MIGRATION_UNBOUNDED lifted)."""
        server: dict[str, int] = {
            "statement_timeout": _ms(self.statement_s),
            "lock_timeout": _ms(self.lock_s),
            "idle_in_transaction_session_timeout": _ms(self.idle_tx_s),
            "tcp_keepalives_idle": self.keepalive_idle_s,
            "tcp_keepalives_interval": self.keepalive_interval_s,
            "tcp_keepalives_count": self.keepalive_count,
        }
        if migration:
            server.update(dict.fromkeys(MIGRATION_UNBOUNDED, 0))
        return {
            "connect_timeout": 10,
            # Unacknowledged data for longer than the keepalives take to give up: the connection is dead.
            "tcp_user_timeout": 1000 * (self.keepalive_idle_s + self.keepalive_interval_s * self.keepalive_count),
            "keepalives": 1,
            "keepalives_idle": self.keepalive_idle_s,
            "keepalives_interval": self.keepalive_interval_s,
            "keepalives_count": self.keepalive_count,
            "options": " ".join(f"-c {k}={v}" for k, v in server.items()),
        }


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def engine_kwargs(url: str, migration: bool = False) -> dict:
    """Engine options for our tables and Optuna's: pre-ping, recycling, bounded waits (for a `migration`, see
    MIGRATION_UNBOUNDED); SQLite waits for locks."""
    if make_url(url).get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 120}}
    _wait_in_python()  # signals are handled while libpq waits, and a stop ends the wait
    return {
        "pool_pre_ping": True,
        "pool_recycle": 300,
        "pool_size": 2,
        "max_overflow": 4,
        "connect_args": PgTimeouts.from_env().connect_args(migration),
    }


@cache
def get_engine(url: str) -> Engine:
    """One engine per URL and process."""
    try:
        return create_engine(url, **engine_kwargs(url))
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise TunerError(
            f"storage {mask_url(url)}: not a usable database URL ({first_line(scrub(str(exc), url))})"
        ) from exc


def check_reachable(url: str) -> None:
    """Raise a one-line `Unavailable` (a TunerError, exit status 3) unless the database answers."""
    try:
        with get_engine(url).connect() as conn:
            conn.execute(text("SELECT 1"))
    except OperationalError as exc:
        reason = first_line(scrub(str(exc.orig or exc), url))
        raise Unavailable(f"storage {mask_url(url)}: cannot connect ({reason})") from exc


def _script_location() -> str:
    """The migrations folder: `migrations/` beside this `tuner/` in a checkout, else the installed `tuner.migrations`.

    The checkout comes first so that an editable install never migrates with another tree's revisions.
    """
    beside = Path(__file__).resolve().parents[2] / "migrations"
    if (beside / "env.py").is_file():
        return str(beside)
    return str(resources.files("tuner.migrations"))


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
    """Migrate our tables to head (refusing a schema newer than this code); returns (before, after).

    Call under `schema_lock` (two first-time set-ups at once would both create the tables).
    """
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
        with get_engine(url).begin() as conn:
            if conn.dialect.name == "postgresql":
                for limit in MIGRATION_UNBOUNDED:  # a migration may take long; it holds the schema lock
                    conn.execute(text(f"SET LOCAL {limit} = 0"))
            command.upgrade(_alembic_config(conn), "head")  # type: ignore[arg-type]
    return before, head_revision()


def db_clock(dialect: str) -> ColumnElement[float]:
    """The database's clock in SQL: seconds since the epoch (one clock for every host of a study)."""
    if dialect == "postgresql":
        return literal_column("extract(epoch from clock_timestamp())")
    return literal_column("(julianday('now') - 2440587.5) * 86400.0")


def db_epoch(conn: object) -> float:
    """Seconds since the epoch by the database's clock (one clock for every host of a study)."""
    bind = conn.get_bind() if hasattr(conn, "get_bind") else conn
    return float(conn.execute(select(db_clock(bind.dialect.name))).scalar())  # type: ignore[attr-defined]


def db_now(url: str) -> float:
    """The database clock now (seconds since the epoch): what claims and stamps shared by hosts are judged by."""
    with get_engine(url).connect() as conn:
        return db_epoch(conn)


class HeldLock:
    """A lock held by `named_lock`; `check()` raises a database error if the server has ended its session."""

    def __init__(self, conn: Connection | None = None) -> None:
        self.conn = conn

    def check(self) -> None:
        """Still held? (A frozen holder's session is ended by the server after `lock_hold_s` idle.)"""
        if self.conn is not None:
            self.conn.execute(text("SELECT 1"))
            self.conn.commit()


def lock_key(name: str) -> int:
    """The PostgreSQL advisory-lock key of a named lock."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def named_lock(url: str, name: str, lock_file: Path, keep_alive: bool = False) -> Iterator[HeldLock]:
    """An exclusive lock across processes and hosts, waited for (`keep_alive`: see `_named_lock`).

    PostgreSQL: a session advisory lock, released by the server if the holder dies, is partitioned
    away (TCP keepalives) or sits idle holding it for `lock_hold_s` (frozen); a wait longer than
    `lock_timeout` logs who holds it and goes on waiting. SQLite (one host): an flock on `lock_file`.
    """
    with _named_lock(url, name, lock_file, blocking=True, keep_alive=keep_alive) as held:
        assert held is not None
        yield held


@contextlib.contextmanager
def _named_lock(
    url: str, name: str, lock_file: Path, blocking: bool, keep_alive: bool = False
) -> Iterator[HeldLock | None]:
    """The lock (None if `blocking` is off and another holds it). `keep_alive`: for a lock held across a long
    computation that leaves its session idle, a thread touches the session so the server keeps it while
    this process runs (a frozen process stops touching it, and the server ends the session as for any lock)."""
    if make_url(url).get_backend_name() != "postgresql":
        with open(lock_file, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield None
                return
            try:
                yield HeldLock()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
        return
    key = lock_key(name)
    with get_engine(url).connect() as conn:
        # Autocommit: the lock's session is never idle inside a transaction, where idle_session_timeout does not
        # apply (a holder frozen between a statement and its commit would keep the lock for idle_tx_s). The limit
        # is set before the lock is taken, so no moment of holding it is without one.
        conn.execution_options(isolation_level="AUTOCOMMIT")
        hold = conn.dialect.server_version_info >= (14,)
        if hold:  # idle_session_timeout exists from PostgreSQL 14
            conn.execute(text(f"SET idle_session_timeout = {_ms(PgTimeouts.from_env().lock_hold_s)}"))
        if blocking:
            _acquire(conn, key, name)
        elif not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            if hold:
                conn.execute(text("RESET idle_session_timeout"))
            yield None
            return
        toucher = _SessionToucher(conn, PgTimeouts.from_env().lock_hold_s / 4) if keep_alive else None
        try:
            yield HeldLock(None if toucher else conn)
        finally:
            if toucher is not None:
                toucher.stop()
            _release(conn, key, name, hold)


class _SessionToucher(threading.Thread):
    """Runs `SELECT 1` on a lock's own connection every `every_s` seconds until stopped (see `_named_lock`)."""

    def __init__(self, conn: Connection, every_s: float) -> None:
        super().__init__(daemon=True, name="lock-keep-alive")
        self.conn, self.every_s, self.done = conn, every_s, threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            try:
                self.conn.execute(text("SELECT 1"))
                self.conn.commit()
            except SQLAlchemyError:
                return  # the session is gone (and the lock with it); the release says so

    def stop(self) -> None:
        self.done.set()
        self.join()


def _acquire(conn: Connection, key: int, name: str) -> None:
    from psycopg2.errors import LockNotAvailable

    while True:
        try:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            return
        except OperationalError as exc:
            if not isinstance(exc.orig, LockNotAvailable):
                raise
            conn.rollback()
            holder = conn.execute(
                text(
                    "SELECT a.pid, a.client_addr, a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid "
                    "= l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :hi AND l.objid = :lo"
                ),
                {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
            ).first()
            conn.commit()
            log.warning(
                "still waiting for the lock %s (held by server pid %s from %s)",
                name,
                holder[0] if holder else "?",
                holder[1] if holder else "?",
            )


def _release(conn: Connection, key: int, name: str, hold: bool) -> None:
    try:
        conn.rollback()  # after a failed check() the connection must be reset before it is used again
        released = conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key}).scalar()
        if hold:
            conn.execute(text("RESET idle_session_timeout"))
        conn.commit()
    except SQLAlchemyError as exc:
        released, why = False, type(getattr(exc, "orig", None) or exc).__name__
    else:
        why = "its session had ended"
    if not released:  # the session is gone, and the server released the lock with it
        log.warning("the lock %s was released by the server before this process finished with it (%s)", name, why)


def _sqlite_lock_file(url: str, suffix: str) -> Path:
    database = make_url(url).database or ""
    return Path(f"{database}.{suffix}") if database and database != ":memory:" else Path(f"/tmp/route-tuner-{suffix}")


def study_lock(url: str, study: str) -> contextlib.AbstractContextManager[HeldLock]:
    """The per-study lock: counting the budget and asking, reaping."""
    return named_lock(url, f"route-tuner:{study}", _sqlite_lock_file(url, f"{study}.lock"))


def confirmation_lock(url: str, study: str, wait: bool = True) -> contextlib.AbstractContextManager[HeldLock | None]:
    """One confirmation of a study at a time, on every host; `tuner gc --yes` takes it without waiting (`wait=False`).

    Without waiting the block gets None when a confirmation holds it.
    """
    return _named_lock(
        url,
        f"route-tuner-confirm:{study}",
        _sqlite_lock_file(url, f"{study}.confirm.lock"),
        blocking=wait,
        keep_alive=True,
    )


def schema_lock(url: str) -> contextlib.AbstractContextManager[HeldLock]:
    """The lock around creating and migrating Optuna's tables and ours (one set-up at a time).

    Kept alive while this process runs (a migration of a large database outlasts `lock_hold_s` on a connection of
    its own, leaving the lock's session idle); a frozen holder's session still ends as for any lock."""
    return named_lock(url, SCHEMA_LOCK, _sqlite_lock_file(url, "schema-migration"), keep_alive=True)
