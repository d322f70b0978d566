"""Hardened storage: reaping that cannot race, host identity, first-time set-ups at once, bounded
PostgreSQL waits, and no password in the database."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import optuna
import psycopg2
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from tests.conftest import REPO, tuner
from tests.helpers import all_rows_text, start_tuner, trials, wait_for_file
from tests.proxy import in_front_of
from tuner.spec import load_spec
from tuner.store.db import (
    MIGRATION_UNBOUNDED,
    OUTAGE,
    SCHEMA_LOCK,
    PgTimeouts,
    _alembic_config,
    get_engine,
    head_revision,
    lock_key,
    schema_lock,
    study_lock,
)
from tuner.store.leases import HOST, Owner
from tuner.store.urls import normalize_url
from tuner.study.optuna_adapter import open_storage
from tuner.study.setup import Context, prepare
from tuner.worker.loop import Worker

# -- leases and reaping ---------------------------------------------------------------------------


@pytest.fixture
def worker(write_spec, pg_url) -> Worker:
    """A real worker (in this process) on a prepared PostgreSQL study with a 60 s grace period."""
    ctx = Context(load_spec(write_spec(**{"run.grace_s": 60.0})), normalize_url(pg_url))
    prepare(ctx)
    return Worker(ctx, budget=10)


def _running_trial(w: Worker, started: datetime.datetime | None = None) -> int:
    """A RUNNING trial as another host's worker would have created it (Optuna stamps its local clock)."""
    template = optuna.trial.create_trial(state=TrialState.RUNNING, params={}, distributions={})
    if started is not None:
        template.datetime_start = started
    return w.study._storage.create_new_trial(w.study_id, template_trial=template)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _set_heartbeat(w: Worker, trial_id: int, seconds_ago: float) -> None:
    with w.leases.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE tuner_leases SET heartbeat_at = extract(epoch from clock_timestamp()) - :s WHERE trial_id = :t"
            ),
            {"s": seconds_ago, "t": trial_id},
        )


def test_a_trial_without_a_lease_ages_on_the_database_clock(worker: Worker) -> None:
    # Asked an instant ago by a host whose clock is an hour behind, and its worker died before leasing.
    tid = _running_trial(worker, datetime.datetime.now() - datetime.timedelta(hours=1))
    assert worker.reaper.reap() == []  # not judged by the skewed local clock
    with worker.leases.engine.connect() as conn:
        age = conn.execute(
            text("SELECT extract(epoch from clock_timestamp()) - heartbeat_at FROM tuner_leases WHERE trial_id = :t"),
            {"t": tid},
        ).scalar()
    assert 0 <= age < 30  # an ownerless lease stamped by the database clock when first seen
    _set_heartbeat(worker, tid, 61)  # a grace period later by that clock
    assert len(worker.reaper.reap()) == 1
    assert worker.study._storage.get_trial(tid).user_attrs["failure_class"] == "lost"


def test_a_lease_that_beats_again_after_being_judged_lost_is_not_reaped(worker: Worker) -> None:
    tid = _running_trial(worker)
    fence = worker.leases.take(tid, Owner("w9-frozen", host="elsewhere", pid=1))
    _set_heartbeat(worker, tid, 3600)  # its worker was frozen (SIGSTOP, a long GC pause) ...
    assert worker.leases.expired([tid], 60.0) == [tid]
    assert worker.leases.beat(fence)  # ... and resumed before the reaper took the study lock
    assert worker.leases.claim_reap(tid, 60.0) is None
    assert worker.study._storage.get_trial(tid).state == TrialState.RUNNING
    _set_heartbeat(worker, tid, 3600)
    assert worker.leases.claim_reap(tid, 60.0) is not None


def test_a_trial_whose_reaper_died_midway_is_reaped_again(worker: Worker) -> None:
    tid = _running_trial(worker)
    worker.leases.take(tid, Owner("w2-gone", host="elsewhere", pid=1))
    _set_heartbeat(worker, tid, 3600)
    assert worker.leases.claim_reap(tid, 60.0)  # a reaper claimed it, then died before failing the trial
    assert worker.study._storage.get_trial(tid).state == TrialState.RUNNING
    assert worker.reaper.reap() == [worker.study._storage.get_trial(tid).number]
    assert worker.study._storage.get_trial(tid).state == TrialState.FAIL


@pytest.mark.parametrize("call", ["expired", "claim_reap"])
def test_a_reap_that_waits_out_an_outage_reaps_no_trial_for_the_heartbeats_it_missed(
    call: str, write_spec, pg_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, url = in_front_of(pg_url)
    ctx = Context(load_spec(write_spec(**{"run.grace_s": 60.0})), normalize_url(url))
    prepare(ctx)
    worker = Worker(ctx, budget=10)
    tid = _running_trial(worker)
    worker.leases.take(tid, Owner("w9-alive", host="elsewhere", pid=1))  # alive: it beats once the database is back
    _set_heartbeat(worker, tid, 3600)  # stale, as every heartbeat is when an outage ends
    asked = getattr(worker.leases, call)

    def as_the_database_goes(*args: Any, **kwargs: Any) -> Any:
        proxy.cut()  # after the reaper looked at the running trials (and, for claim_reap, found this one lost)
        return asked(*args, **kwargs)

    noticed = OUTAGE.failed

    def failed_then_back(exc: BaseException | None) -> None:
        noticed(exc)
        proxy.restore()  # the database returns while the call waits to try again

    monkeypatch.setattr(worker.leases, call, as_the_database_goes)
    monkeypatch.setattr(OUTAGE, "failed", failed_then_back)
    try:
        assert worker.reaper.reap() == []
    finally:
        proxy.cut()
    assert OUTAGE.recent(60.0)  # the outage was seen, and it is over
    assert optuna.load_study(study_name="tiny", storage=normalize_url(pg_url)).trials[-1].state == TrialState.RUNNING


FROZEN_LEASE_HOLDER = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.orm import Session
from tuner.store.leases import Fence, Leases
url, study, trial_id, epoch, marker, where = sys.argv[1:]
leases, fence = Leases(url, study), Fence(int(trial_id), int(epoch))

def freeze(conn, cursor, statement, *args):
    if statement.lstrip().upper().startswith("UPDATE TUNER_LEASES"):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen right after its statement on the lease

event.listen(leases.engine, "after_cursor_execute", freeze)
try:
    if where == "beat":
        first = leases.beat(fence)
    else:  # a tell: its transaction holds the lease (locked) while it writes the outcome
        with Session(leases.engine) as s, s.begin():
            fence.hold(s.connection())
        first = "told"
except Exception as exc:
    first = type(exc).__name__
event.remove(leases.engine, "after_cursor_execute", freeze)
print(first, leases.beat(fence))
"""


@pytest.mark.parametrize(
    "where, idle_tx_s, after",
    [
        ("beat", 600, "True"),  # committed as it ran: no lock held, the reaper goes on at once
        ("tell", 1, "OperationalError"),  # its open transaction locks the lease until the server ends its session
    ],
)
def test_a_worker_frozen_on_its_lease_is_reaped(
    worker: Worker, pg_url: str, tmp_path: Path, where: str, idle_tx_s: int, after: str
) -> None:
    tid = _running_trial(worker)
    fence = worker.leases.take(tid, Owner("w9-frozen", host="elsewhere", pid=1))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_PG_TIMEOUTS": f"idle_tx_s={idle_tx_s}"}
    args = [normalize_url(pg_url), worker.spec.study, str(tid), str(fence.epoch), str(tmp_path / "frozen"), where]
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FROZEN_LEASE_HOLDER), *args], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for_file(tmp_path / "frozen", holder)
        _set_heartbeat(worker, tid, 3600)  # stopped for an hour: past the grace period (waits for any lock it holds)
        assert worker.reaper.reap() == [worker.study._storage.get_trial(tid).number]
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    out, _ = holder.communicate(timeout=60)
    assert out.split() == [after, "False"]  # resumed, its next beat finds the lease reaped
    assert worker.study._storage.get_trial(tid).user_attrs["failure_class"] == "lost"


def test_the_server_ends_a_frozen_transaction_before_a_waiter_gives_up_its_lock_wait() -> None:
    timeouts = PgTimeouts()
    assert timeouts.idle_tx_s < timeouts.lock_s < timeouts.statement_s


def test_a_dead_pid_is_trusted_only_from_the_same_boot_and_pid_namespace(worker: Worker) -> None:
    assert HOST.startswith(socket.gethostname() + " ") and "pidns=" in HOST
    pid = _dead_pid()
    # Another container with the same hostname: its PIDs mean nothing here; its heartbeat is fresh.
    other = _running_trial(worker)
    worker.leases.take(other, Owner("w0-container", host=socket.gethostname(), pid=pid))
    assert worker.reaper.reap() == []
    assert worker.study._storage.get_trial(other).state == TrialState.RUNNING
    # The same host, boot and PID namespace: a dead owner is reaped at once.
    here = _running_trial(worker)
    worker.leases.take(here, Owner("w1-dead", host=HOST, pid=pid))
    assert worker.reaper.reap() == [worker.study._storage.get_trial(here).number]


# -- first-time set-up --------------------------------------------------------------------------


def _waiting_on(admin: object, key: int) -> int:
    with admin.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
        return cur.fetchone()[0]


def test_first_time_set_ups_at_once_on_an_empty_database_all_succeed(write_spec, pg_url, tmp_path: Path) -> None:
    key = lock_key(SCHEMA_LOCK)
    holder = psycopg2.connect(pg_url)
    holder.autocommit = True
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (key,))
    specs = [write_spec(f"s{i}.toml", **{"study.name": f"first{i}", "run.budget": 1}) for i in range(2)]
    procs = [start_tuner("db", "upgrade", "--storage", pg_url, log=tmp_path / f"up{i}.log") for i in range(3)]
    procs += [
        start_tuner("run", str(s), "--no-confirm", "--storage", pg_url, log=tmp_path / f"{s.stem}.log") for s in specs
    ]
    deadline = time.monotonic() + 120
    while _waiting_on(holder, key) < len(procs):  # every set-up queues on the schema lock ...
        exited = [p.args for p in procs if p.poll() is not None]
        assert not exited, f"a set-up did not wait for the schema lock: {exited}"
        assert time.monotonic() < deadline, "the set-ups did not all reach the schema lock"
        time.sleep(0.05)
    with holder.cursor() as cur:  # ... and all start at the same moment when it is released
        cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
    holder.close()
    logs = [p.wait(timeout=300) for p in procs]
    assert logs == [0] * len(procs), [
        (tmp_path / f).read_text() for f in sorted(os.listdir(tmp_path)) if f.endswith(".log")
    ]
    engine = create_engine(normalize_url(pg_url))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM tuner_alembic_version")).scalar() == head_revision()
        assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar() == 1
    engine.dispose()
    assert all(len(trials(pg_url, f"first{i}")) == 1 for i in range(2))


# -- bounded waits --------------------------------------------------------------------------------


def test_every_postgresql_connection_has_bounded_waits_and_keepalives(pg_url) -> None:
    url = normalize_url(pg_url)
    storage = open_storage(url)
    for engine in (get_engine(url), storage.engine):
        with engine.connect() as conn:
            settings = {
                n: conn.execute(text(f"SHOW {n}")).scalar()
                for n in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                    "tcp_keepalives_idle",
                )
            }
            dsn = conn.connection.dbapi_connection.get_dsn_parameters()
        assert settings == {
            "statement_timeout": "5min",
            "lock_timeout": "1min",
            "idle_in_transaction_session_timeout": "30s",
            "tcp_keepalives_idle": "30",
        }
        assert dsn["keepalives"] == "1" and dsn["keepalives_idle"] == "30"


def test_a_migration_s_connections_have_no_statement_or_transaction_limit_and_keep_the_others(pg_url) -> None:
    with open_storage(normalize_url(pg_url), migration=True).engine.connect() as conn:
        settings = {n: conn.execute(text(f"SHOW {n}")).scalar() for n in (*MIGRATION_UNBOUNDED, "lock_timeout")}
    assert settings == {"statement_timeout": "0", "idle_in_transaction_session_timeout": "0", "lock_timeout": "1min"}


def test_the_schema_lock_of_a_running_process_outlasts_lock_hold_s_where_an_idle_study_lock_does_not(
    pg_url, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A migration runs on a connection of its own while the schema lock's session sits idle; the server must not end
    # that session (and release the lock to a second migration) while the migrating process is alive.
    url = normalize_url(pg_url)
    monkeypatch.setenv("TUNER_PG_TIMEOUTS", "lock_hold_s=2")
    other = create_engine(url)
    with schema_lock(url), study_lock(url, "s") as study_held:
        time.sleep(6)  # three times lock_hold_s: the server's limit elapses (no process is waited for)
        with other.connect() as conn:
            schema_free = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(SCHEMA_LOCK)}).scalar()
        with pytest.raises(OperationalError):
            study_held.check()  # the idle study lock's session was ended: the limit did elapse
    other.dispose()
    assert schema_free is False


HOLDER = """
import os, signal, sys
from sqlalchemy import text
from tuner.store.db import study_lock
with study_lock(sys.argv[1], "s") as held:
    if sys.argv[3] == "mid-check":  # frozen between check()'s statement and its commit
        held.conn.execute(text("SELECT 1"))
    open(sys.argv[2], "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen while holding the study lock
    try:
        held.check()
        print("still held")
    except Exception as exc:
        print("lost:", type(exc).__name__)
"""

WAITER = """
import sys
from tuner.store.db import study_lock
with study_lock(sys.argv[1], "s"):
    print("acquired")
"""


@pytest.mark.parametrize("frozen", ["idle", "mid-check"])
def test_a_frozen_study_lock_holder_does_not_stall_the_other_workers(pg_url, tmp_path: Path, frozen: str) -> None:
    # The lock's session is ended after lock_hold_s wherever its holder froze, also between a statement on it and
    # that statement's commit (idle_tx_s, set long here, would keep the waiter past its deadline).
    url = normalize_url(pg_url)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TUNER_PG_TIMEOUTS": "lock_hold_s=1,idle_tx_s=600"}
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), url, str(tmp_path / "held"), frozen],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_file(tmp_path / "held", holder)
        waiter = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(WAITER), url], env=env, capture_output=True, text=True, timeout=120
        )
        assert waiter.returncode == 0 and waiter.stdout.strip() == "acquired", waiter.stderr
    finally:
        os.kill(holder.pid, signal.SIGCONT)
    out, _ = holder.communicate(timeout=60)
    assert out.strip().startswith("lost:")  # the holder learns it no longer holds the lock (and would not ask) ...
    assert holder.returncode == 0  # ... and leaves the lock without an error


def test_bad_timeout_settings_are_one_line(write_spec, pg_url) -> None:
    result = tuner("status", str(write_spec()), "--storage", pg_url, env={"TUNER_PG_TIMEOUTS": "lock_s=soon"})
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1
    assert err.endswith(
        "$TUNER_PG_TIMEOUTS: 'lock_s=soon': expected name=positive number, names: statement_s, "
        "lock_s, idle_tx_s, keepalive_idle_s, keepalive_interval_s, keepalive_count, lock_hold_s"
    )


# -- no password in the database ----------------------------------------------------------------


def test_the_database_holds_no_password_from_the_study_file(cli, write_spec, pg_url) -> None:
    secret = "pw-9f3c1e77"
    url = pg_url.replace("postgres@", f"postgres:{secret}@")  # trust authentication ignores it
    spec = write_spec(**{"study.storage": url, "run.budget": 1})
    result = cli("run", str(spec), "--no-confirm")
    assert result.returncode == 0, result.stderr
    dump = all_rows_text(pg_url)
    assert "postgres:***@127.0.0.1" in dump  # the study file is stored, masked
    assert secret not in dump


def test_upgrade_masks_passwords_stored_by_an_older_version(pg_url) -> None:
    from alembic import command

    engine = create_engine(normalize_url(pg_url))
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
        conn.execute(
            text("INSERT INTO tuner_studies (name, fingerprint, spec_text, created_at) VALUES ('old', '{}', :t, 0)"),
            {"t": '[study]\nstorage = "postgresql://me:hunter2-x@db/tuning"\n'},
        )
    up = tuner("db", "upgrade", "--storage", pg_url)
    assert up.returncode == 0, up.stderr
    with engine.connect() as conn:
        spec_text, uid = conn.execute(text("SELECT spec_text, uid FROM tuner_studies")).one()
    engine.dispose()
    assert spec_text == '[study]\nstorage = "postgresql://me:***@db/tuning"\n'
    assert len(uid) == 32
