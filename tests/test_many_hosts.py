"""Several hosts on one study: claims judged by the database clock, one confirmation at a time, one kind of device.

Real PostgreSQL, real `tuner run` processes, real advisory locks. A host whose clock is off is this
process with the racing module's clock shifted (the only thing that differs between hosts here).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import psycopg2
from sqlalchemy import create_engine, text

from tests.conftest import tuner
from tests.helpers import start_tuner
from tuner.spec import load_spec
from tuner.store.cache import ResultStore
from tuner.store.db import lock_key
from tuner.store.urls import normalize_url
from tuner.study import racing
from tuner.study.setup import Context, prepare
from tuner.worker import race
from tuner.worker.isolate import ChildHandle
from tuner.worker.race import Racer


def test_a_racing_claim_is_judged_by_the_database_clock(write_spec, pg_url, monkeypatch) -> None:
    ctx = Context(load_spec(write_spec(**{"run.trial_timeout_s": 600.0})), normalize_url(pg_url))
    study = prepare(ctx)
    results = ResultStore(ctx.url)
    behind = SimpleNamespace(time=lambda: time.time() - 7200, time_ns=time.time_ns)  # a host whose clock is 2 h behind
    monkeypatch.setattr(race, "time", behind)
    assert Racer(ctx, study, results, "w-behind", ChildHandle())._claim(5, "run-1")
    monkeypatch.setattr(race, "time", time)
    claim = racing.races(study)["5"]["claim"]
    assert abs(claim["since"] - time.time()) < 600  # stamped by the database, not by the claiming host
    assert not Racer(ctx, study, results, "w-other", ChildHandle())._claim(5, "run-2")  # a fresh claim: not taken over


def _waiters(conn: psycopg2.extensions.connection, key: int) -> int:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s AND objid = %s",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        )
        return int(cur.fetchone()[0])


def test_two_confirmations_at_once_measure_once_and_agree(write_spec, pg_url, tmp_path: Path) -> None:
    spec = write_spec(
        **{
            "run.budget": 3,
            "run.racing": False,
            "backend.space": {"intra_op_threads": [0, 1, 2], "execution_mode": ["sequential"], "precision": ["fp32"]},
        }
    )
    first = tuner("run", str(spec), "--storage", pg_url, "--no-confirm")
    assert first.returncode == 0, first.stderr
    key = lock_key("route-tuner-confirm:tiny")
    holder = psycopg2.connect(pg_url)
    holder.autocommit = True
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (key,))  # as if a third confirmation were running: both must wait
    args = ("run", str(spec), "--storage", pg_url, "--confirm-top-k", "1", "--confirm-rounds", "6")
    procs = [start_tuner(*args, log=tmp_path / f"confirm-{i}.log", env={"COLUMNS": "1000"}) for i in range(2)]
    try:
        deadline = time.monotonic() + 300
        while _waiters(holder, key) < 2:  # both runs now wait for the confirmation lock
            assert all(p.poll() is None for p in procs), [
                (tmp_path / f"confirm-{i}.log").read_text()[-2000:] for i in range(2)
            ]
            assert time.monotonic() < deadline, "the two confirmations never waited for each other"
            time.sleep(0.1)  # polling the lock table for an event the runs announce there
        with holder.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        holder.close()
    logs = [(tmp_path / f"confirm-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs
    engine = create_engine(normalize_url(pg_url))
    with engine.connect() as conn:
        runs = (
            conn.execute(text("SELECT DISTINCT result_key FROM tuner_measurements WHERE kind = 'confirm'"))
            .scalars()
            .all()
        )
    engine.dispose()
    assert len(runs) == 1, runs  # one confirmation measured; the other took its result
    assert sum("another run confirmed this study" in log for log in logs) == 1, logs
    verdicts = [next(line for line in log.splitlines() if line.startswith("confirmation: ")) for log in logs]
    assert verdicts[0] == verdicts[1]


def test_a_study_refuses_a_worker_on_other_hardware_unless_it_may_mix(cli, write_spec, pg_url) -> None:
    backend = {"backend.name": "tests.backends:OtherHostBackend", "backend.space": {"precision": ["fp32"]}}
    spec = write_spec(**{"run.budget": 1, **backend})
    first = cli("run", str(spec), "--storage", pg_url, "--no-confirm", env={"TUNER_TEST_CPU": "Xeon A"})
    assert first.returncode == 0, first.stderr
    spec = write_spec(**{"run.budget": 2, **backend})
    for where in (
        ("--workers", "2"),
        ("--gpus", "0"),
    ):  # refused by `tuner run` for CPU workers, by the worker itself on a GPU
        refused = tuner("run", str(spec), "--storage", pg_url, "--no-confirm", *where, env={"TUNER_TEST_CPU": "EPYC B"})
        assert refused.returncode == 2, refused.stderr
        assert (
            "the study runs on 'Xeon A', this worker on 'EPYC B'" in refused.stderr and "mix_devices" in refused.stderr
        )
    engine = create_engine(normalize_url(pg_url))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM trials")).scalar() == 1  # nothing ran on the other hardware
    engine.dispose()
    mixed = write_spec(**{"run.budget": 2, "run.mix_devices": True, **backend})
    allowed = cli("run", str(mixed), "--storage", pg_url, "--no-confirm", env={"TUNER_TEST_CPU": "EPYC B"})
    assert allowed.returncode == 0, allowed.stderr
    bad = write_spec(**{"run.mix_devices": "yes"})
    assert "run.mix_devices" in cli("status", str(bad)).stderr
