"""A trial's lifecycle under stopped workers and held locks: waits are never the route's, nothing wedges.

Real PostgreSQL, real workers and children, real signals (SIGSTOP/SIGCONT); every wait is for an
event the system announces (a marker file, a trial's state, a lock-wait report).
"""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from optuna.trial import TrialState
from sqlalchemy import select
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.orm import Session

from tests.conftest import REPO, SpecWriter
from tests.helpers import proc_stat, start_tuner, stuck_run, trial_dir, trials, wait_for_file
from tuner import job as J
from tuner.measure.exclusive import HOST, DeviceLock, LockWaitExpired, private_dir, waited
from tuner.spec import load_spec
from tuner.store.cache import ResultStore
from tuner.store.db import get_engine
from tuner.store.leases import LeaseLost
from tuner.store.models import CachedResult
from tuner.store.urls import normalize_url
from tuner.study.setup import Context
from tuner.worker.after_tell import EnvironmentPause
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job

FAULT = "tests.backends:FaultBackend"


def _until(  # noqa: ANN201
    condition,  # noqa: ANN001
    what: str,
    limit_s: float = 240.0,
    proc: subprocess.Popen | None = None,
    run: tuple[str, Path] | None = None,
):
    """Poll `condition()` until it returns something true (an event the system under test records); return it.

    A miss says what the run (its storage URL and log file) was doing: `stuck_run`, its log and database sessions."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}\n{_doing(run)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit_s} s\n{_doing(run)}")
        time.sleep(0.1)


def _doing(run: tuple[str, Path] | None) -> str:
    return "" if run is None else stuck_run(*run)


def _counted(ts: list) -> list:  # noqa: ANN001
    return [t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def _run_with_blocked_baseline(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, budget: int, grace_s: float = 4.0
) -> tuple[subprocess.Popen[bytes], Path]:
    """`tuner run` with 2 workers and a lease clock of seconds (`grace_s`), whose baseline build blocks until `release`
    appears in the markers folder: (its process, that folder)."""
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"default": "block"}},
            "run.budget": budget,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": grace_s,
            "run.sampler": "random",  # cheap to ask: the study's time goes to the lifecycle under test
        }
    )
    return start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log"), markers


def test_a_stopped_baseline_worker_is_reaped_and_the_study_ends_at_its_budget(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, own_timing_locks: Path
) -> None:
    proc, markers = _run_with_blocked_baseline(write_spec, pg_url, tmp_path, budget=4)
    try:
        wait_for_file(markers / "blocked-default", proc)
        stopped = int((markers / "blocked-default").read_text())  # the worker of trial 0, the baseline, mid-build
        os.kill(stopped, signal.SIGSTOP)
        (markers / "release").touch()  # its child goes on (it is not stopped), finishes and exits; its result waits
        # The other worker reaps the baseline, re-runs it and spends the whole budget while the first is frozen.
        _until(
            lambda: len(_counted(trials(pg_url, "tiny"))) >= 4,
            "the budget spent",
            proc=proc,
            run=(pg_url, tmp_path / "run.log"),
        )
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    ts = sorted(trials(pg_url, "tiny"), key=lambda t: t.number)
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert len(_counted(ts)) == 4  # exactly the budget
    assert ts[0].state == TrialState.FAIL and ts[0].user_attrs["failure_class"] == "lost"
    assert not [t for t in ts if t.user_attrs.get("failure_class") == "timeout"]  # nobody waited into a timeout
    rerun = [t for t in ts if t.user_attrs.get("retry_of") == 0]
    assert len(rerun) == 1 and rerun[0].state == TrialState.COMPLETE and rerun[0].user_attrs["source"] == "baseline"
    # Fenced: once resumed, the reaped worker's late result is discarded with one line, and nothing of it is stored.
    log = (tmp_path / "run.log").read_text()
    assert log.count("trial 0 was reaped while this worker was stopped; nothing more of it is recorded") == 1, log[
        -3000:
    ]
    assert "Traceback" not in log and "UpdateFinishedTrialError" not in log
    url = normalize_url(pg_url)
    measured = [m.trial_number for m in ResultStore(url).measurements("tiny", kind="trial")]
    assert 0 not in measured and len(measured) == len(set(measured))  # nothing written twice
    with Session(get_engine(url)) as s:
        assert not s.scalars(
            select(CachedResult).where(CachedResult.study == "tiny", CachedResult.trial_number == 0)
        ).all()


def _leased(pg_url: str) -> dict[int, int]:
    """trial number -> pid of the worker holding its lease, for the running leases of study `tiny`."""
    with get_engine(normalize_url(pg_url)).connect() as c:
        rows = c.exec_driver_sql(
            "SELECT t.number, l.pid FROM tuner_leases l JOIN trials t ON t.trial_id = l.trial_id"
            " WHERE l.state = 'running' AND l.study = 'tiny'"
        ).all()
    return {int(number): int(pid) for number, pid in rows}


def test_a_trial_started_while_the_baseline_runs_builds_meanwhile_and_is_timed_against_it(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, own_timing_locks: Path
) -> None:
    # The baseline's build blocks until released. The other worker's trial (the recommended int8 route) does not wait
    # for it to start: its child builds, loads and gates meanwhile, then waits for the baseline's engine holding no
    # lock (the baseline's timing, exclusive, would otherwise wait for it) and is timed against it.
    # Nothing is reaped here: a lease clock of minutes keeps a worker slowed by a loaded host from being taken for lost.
    proc, markers = _run_with_blocked_baseline(write_spec, pg_url, tmp_path, budget=2, grace_s=120.0)
    run = (pg_url, tmp_path / "run.log")
    try:
        wait_for_file(markers / "blocked-default", proc)

        def phase_of_trial_1() -> str | None:
            if 1 not in _leased(pg_url):
                return None
            result = trial_dir(pg_url, "tiny", tmp_path / ".tuner" / "tiny", 1) / "result.json"
            return json.loads(result.read_text()).get("phase") if result.exists() else None

        assert _until(lambda: phase_of_trial_1() == "baseline-wait", "trial 1's child waiting", proc=proc, run=run)
        assert len(list(markers.glob("build-*"))) == 2  # both routes built, the baseline's blocked inside it
    finally:
        (markers / "release").touch()
    assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    ts = sorted(trials(pg_url, "tiny"), key=lambda t: t.number)
    base, late = ts[0].user_attrs, ts[1].user_attrs
    assert len(ts) == 2 and ts[0].state == TrialState.COMPLETE, [t.user_attrs.get("message") for t in ts]
    assert late.get("failure_class", "") in ("", "slow"), late.get("message")  # timed (int8 may lose to fp32 here)
    assert base["source"] == "baseline" and base["timing"]["exclusive"] is True
    assert late["paired"] and late["timing"]["baseline_trial"] == 0, late.get("unpaired")
    assert late["timing"]["baseline_wait_s"] > 0 and late["phase_s"]["baseline-wait"] > 0


# Loaded into every process of the run: a worker stops itself (SIGSTOP) as it writes trial 1's job, just before it
# takes the start-up hold and starts the trial's child.
STOP_BEFORE_THE_CHILD = """
import os, signal, sys

def _hook(event, args):
    if event == "open" and str(args[0]).endswith("00001/job.json") and "w" in str(args[1]):
        if b"tuner.worker.main" in open("/proc/self/cmdline", "rb").read():
            os.kill(os.getpid(), signal.SIGSTOP)

sys.addaudithook(_hook)
"""


def test_a_worker_whose_trial_was_reaped_before_its_child_started_starts_none(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, own_timing_locks: Path
) -> None:
    # The worker of trial 1 stops as it is about to start its child; the other reaps trial 1 and re-queues its route.
    # Once the stopped one goes on, starting a child for the reaped trial would build the route a second time,
    # beside its re-queued run.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STOP_BEFORE_THE_CHILD)
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers)},
            "run.budget": 3,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": 4.0,
            "run.sampler": "random",
        }
    )
    env = {"PYTHONPATH": f"{site}:{REPO}"}
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log", env=env)
    stopped = None
    run = (pg_url, tmp_path / "run.log")
    try:

        def stopped_worker() -> int | None:  # trial 1's worker, once it has stopped itself
            try:
                pid = _leased(pg_url).get(1)
            except ProgrammingError:  # the run has not created its tables yet
                return None
            return pid if pid is not None and proc_stat(pid)[0] == "T" else None

        stopped = _until(stopped_worker, "trial 1's worker stopped before its child", proc=proc, run=run)
        _until(
            lambda: [t for t in trials(pg_url, "tiny") if t.user_attrs.get("failure_class") == "lost"],
            "the stopped worker's trial reaped",
            proc=proc,
            run=run,
        )
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
    assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    ts = trials(pg_url, "tiny")
    assert len(_counted(ts)) == 3
    assert len(list(markers.glob("build-*"))) == 3  # the baseline, the re-queued route, one more: none built twice
    log = (tmp_path / "run.log").read_text()
    assert log.count("was reaped while this worker was stopped") == 1, log[-3000:]


def test_the_lock_directory_is_private(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o777)
    with DeviceLock("host", loose).exclusive() as hold:
        assert hold.held
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700  # tightened
    assert stat.S_IMODE((loose / "host.rw").stat().st_mode) == 0o600
    link = tmp_path / "link"
    link.symlink_to(loose)
    with pytest.raises(PermissionError):
        private_dir(link)
    with DeviceLock("host", link).exclusive() as hold:
        assert not hold.held and "refusing" in hold.reason  # timed, but recorded as not exclusive
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    (planted / "host.rw").symlink_to(tmp_path / "elsewhere")
    with DeviceLock("host", planted).exclusive() as hold:
        assert not hold.held  # O_NOFOLLOW: a planted link is never followed
    assert not (tmp_path / "elsewhere").exists()


def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(theirs, 65534, 65534)  # root can hand it to another user
    else:
        theirs = Path("/")
    with pytest.raises(PermissionError, match="owned by uid"):
        private_dir(theirs)


HOLDER = [sys.executable, "-m", "tests.lockproc"]


def _holder(device: str, directory: Path, mode: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*HOLDER, device, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{mode}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().startswith(f"held {mode}")
    return proc


def test_a_bounded_wait_for_a_held_lock_expires_as_an_environment_fault(tmp_path: Path) -> None:
    from tuner.worker.environment import environment_fault

    holder = _holder("host", tmp_path, "exclusive")
    try:
        with pytest.raises(LockWaitExpired) as caught, DeviceLock("host", tmp_path, wait_s=0.2).shared():
            pass
        assert environment_fault(caught.value) is not None  # ETIMEDOUT: the machine's, never the route's
        with DeviceLock("host", tmp_path, wait_s=0.2, go_ahead=True).shared() as hold:
            assert not hold.held and "waited" in hold.reason
    finally:
        holder.communicate("")


def _job(write_spec: SpecWriter, tmp_path: Path, **run: object) -> J.Job:
    ctx = Context(load_spec(write_spec(**{f"run.{k}": v for k, v in run.items()})), f"sqlite:///{tmp_path / 'x.db'}")
    return make_job(ctx, ctx.space.default_route(), tmp_path / "t" / "out")


def test_a_childs_wait_for_the_timing_lock_is_not_in_its_deadline(
    write_spec: SpecWriter, tmp_path: Path, own_timing_locks: Path
) -> None:
    job = replace(_job(write_spec, tmp_path, trial_timeout_s=3.0), lock_wait_s=600.0)
    holder = _holder(HOST, own_timing_locks, "shared")  # a stuck build of another trial: no timing can start
    results: list[J.Result] = []
    import threading

    runner = threading.Thread(target=lambda: results.append(run_isolated(job, tmp_path / "t")))
    runner.start()
    try:
        report = J.wait_log(tmp_path / "t" / "result.json")
        # The child has waited longer than its whole timeout: it is not killed for it.
        _until(lambda: waited(report, time.monotonic()) > 2 * job.timeout_s, "a long wait reported", limit_s=120)
        assert runner.is_alive()
    finally:
        holder.communicate("")
    runner.join()
    assert results[0].status == J.OK, results[0].message
    assert json.loads(report.read_text())["waited_s"] > 2 * job.timeout_s


def test_a_child_that_waits_too_long_for_a_lock_is_an_environment_error(
    write_spec: SpecWriter, tmp_path: Path, own_timing_locks: Path
) -> None:
    job = replace(_job(write_spec, tmp_path), lock_wait_s=1.0, build_holds_cores=False)
    holder = _holder(HOST, own_timing_locks, "shared")  # the child's exclusive timing lock is never free
    try:
        result = run_isolated(job, tmp_path / "t")
    finally:
        holder.communicate("")
    assert result.status == J.ENVIRONMENT_ERROR and "waited" in result.message, result.message


# -- atomic transitions and idempotent writes: a connection that breaks after its COMMIT ----------------


@pytest.fixture
def faulty(write_spec: SpecWriter, pg_url: str):  # noqa: ANN201
    """(worker, watch): a real worker whose database connections pass a proxy that can break them after a COMMIT."""
    from tests.pg_faults import Watch
    from tests.proxy import in_front_of
    from tuner.store.urls import normalize_url
    from tuner.study.setup import prepare
    from tuner.worker.loop import Worker

    watch = Watch()
    proxy, url = in_front_of(pg_url, watch)
    ctx = Context(load_spec(write_spec(**{"run.grace_s": 60.0})), normalize_url(url))
    prepare(ctx)
    yield Worker(ctx, budget=10), watch
    proxy.cut()


def _dead_owner_trial(worker) -> int:  # noqa: ANN001
    """A RUNNING trial of an enqueued route whose worker (on this host) is dead: reaped at once."""
    from tuner.store.leases import Owner
    from tuner.study import optuna_adapter as oa

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    worker.study.enqueue_trial(worker.ctx.space.default_route(), user_attrs={"source": "baseline"})
    trial = worker.study.ask()
    worker.leases.take(oa.trial_id(trial), Owner("w9-gone", pid=gone.pid))
    return trial.number


def test_a_reap_broken_after_each_commit_re_queues_once(faulty) -> None:  # noqa: ANN001
    worker, watch = faulty
    number = _dead_owner_trial(worker)
    watch.drop_after_commit("reap", "requeue", "tell")
    assert worker._db(worker.reaper.reap) in ([number], [])  # the retried reap finishes what the broken one began
    worker._db(worker.reaper.reap)
    ts = worker.study.get_trials(deepcopy=False)
    assert set(watch.dropped) >= {"reap", "requeue"}
    lost = next(t for t in ts if t.number == number)
    assert lost.state == TrialState.FAIL and lost.user_attrs["failure_class"] == "lost"
    again = [t for t in ts if t.user_attrs.get("retry_of") == number]
    assert len(again) == 1 and again[0].state == TrialState.WAITING and again[0].user_attrs["source"] == "baseline", [
        (t.number, t.state, t.user_attrs, t.system_attrs) for t in ts
    ]


def test_an_interrupted_tell_broken_after_each_commit_re_queues_once(faulty) -> None:  # noqa: ANN001
    from tuner.study import optuna_adapter as oa

    worker, watch = faulty
    worker.study.enqueue_trial(worker.ctx.space.default_route())
    trial = worker.study.ask()
    fence = worker.leases.take(oa.trial_id(trial), worker.owner)
    watch.drop_after_commit("requeue", "tell")
    worker._hand_back(trial, fence)
    ts = worker.study.get_trials(deepcopy=False)
    assert set(watch.dropped) == {"requeue", "tell"}
    assert next(t for t in ts if t.number == trial.number).user_attrs["failure_class"] == J.INTERRUPTED
    assert len([t for t in ts if t.user_attrs.get("retry_of") == trial.number]) == 1


def test_a_measurement_and_a_racing_change_broken_after_their_commit_are_kept_once(faulty) -> None:  # noqa: ANN001
    from tuner.study import racing

    worker, watch = faulty
    racer, run_id = worker.racer, "run-1"
    assert racer._claim(7, run_id)
    measured = J.Result(
        status=J.OK,
        latency={"median": 1.0},
        samples_ms=[1.0, 1.0, 1.1],
        paired={"paired": True, "speedup": 1.02, "log_ratios": [0.01, 0.03, 0.02, 0.015, 0.025, 0.02, 0.018, 0.022]},
    )
    watch.drop_after_commit("record")
    assert racer._record(7, run_id, measured, 1.0)
    assert set(watch.dropped) == {"record"}
    rows = [m for m in worker.results.measurements("tiny") if m.trial_number == 7]
    assert len(rows) == 1  # the retried insert added nothing
    entry = racing.races(worker.study)["7"]
    assert entry["remeasured"] == 1 and entry["claim"] is None
    assert racer._record(7, run_id, measured, 1.0)  # a record repeated (its reply lost) changes nothing again
    assert racing.races(worker.study)["7"]["remeasured"] == 1
    assert len([m for m in worker.results.measurements("tiny") if m.trial_number == 7]) == 1


# -- fencing: a reaped owner writes nothing ---------------------------------------------------------


def test_a_reap_between_the_owners_check_and_its_write_fences_the_owner_out(faulty, caplog) -> None:  # noqa: ANN001
    from tuner.study import optuna_adapter as oa

    worker, _ = faulty
    route = worker.ctx.space.default_route()
    worker.study.enqueue_trial(route)
    trial = worker.study.ask()
    fence = worker.leases.take(oa.trial_id(trial), worker.owner)
    reaper = worker.leases.claim_reap(oa.trial_id(trial), grace_s=-1.0)  # another worker's reap, not yet written
    assert reaper is not None and reaper.epoch == fence.epoch + 1
    assert worker.leases.beat(fence) is False  # the owner's heartbeat no longer counts
    late = J.Result(status=J.OK, latency={"median": 1.0}, samples_ms=[1.0, 1.1, 0.9])
    with pytest.raises(LeaseLost):
        worker.evaluator._store("k" * 64, trial.number, route, late, fence)
    with caplog.at_level("WARNING", logger="tuner.worker"):
        worker._settle(trial, lambda: worker._tell(trial, late, {}, fence))  # no UpdateFinishedTrialError, no crash
    assert [r.getMessage() for r in caplog.records] == [
        f"trial {trial.number} was reaped while this worker was stopped; nothing more of it is recorded"
    ]
    mine = oa.trial_by_number(worker.study, trial.number)
    assert mine.state == TrialState.RUNNING and "failure_class" not in mine.user_attrs  # the owner wrote nothing
    assert not worker.results.measurements("tiny") and worker.results.lookup("k" * 64) is None
    again = worker.leases.claim_reap(oa.trial_id(trial), grace_s=-1.0)  # the first reaper was thought dead
    assert again is not None
    with pytest.raises(LeaseLost):  # ... so its own write is refused too
        oa.settle_trial(worker.study, trial, TrialState.FAIL, None, {"failure_class": J.LOST}, fence=reaper)
    assert oa.settle_trial(worker.study, trial, TrialState.FAIL, None, {"failure_class": J.LOST}, fence=again)
    assert not oa.settle_trial(worker.study, trial, TrialState.FAIL, None, {}, fence=again)  # repeated: nothing
    assert oa.trial_by_number(worker.study, trial.number).state == TrialState.FAIL


def test_a_trial_reaped_before_its_worker_samples_its_route_is_left_alone(faulty, caplog) -> None:  # noqa: ANN001
    """A worker stopped between reserving and sampling, its trial reaped meanwhile: on waking it samples nothing."""
    import time

    from tuner.study import optuna_adapter as oa

    worker, _ = faulty
    trial = worker.study.ask()
    fence = worker.leases.take(oa.trial_id(trial), worker.owner)
    reaper = worker.leases.claim_reap(oa.trial_id(trial), grace_s=-1.0)
    assert oa.settle_trial(worker.study, trial, TrialState.FAIL, None, {"failure_class": J.LOST}, fence=reaper)
    with caplog.at_level("WARNING", logger="tuner.worker"):
        worker.evaluate_and_tell(trial, fence, time.perf_counter())  # no UpdateFinishedTrialError, no crash
    assert [r.getMessage() for r in caplog.records] == [
        f"trial {trial.number} was reaped while this worker was stopped; nothing more of it is recorded"
    ]
    mine = oa.trial_by_number(worker.study, trial.number)
    assert mine.state == TrialState.FAIL and not mine.params and mine.user_attrs["failure_class"] == J.LOST


# -- bounded attempts and a deadline --------------------------------------------------------------


def _worker(write_spec: SpecWriter, pg_url: str, budget: int = 10, **run: object):  # noqa: ANN202
    from tuner.study.setup import prepare
    from tuner.worker.loop import Worker

    ctx = Context(load_spec(write_spec(**{f"run.{k}": v for k, v in run.items()})), normalize_url(pg_url))
    prepare(ctx)
    return Worker(ctx, budget=budget)


def _ask_retry_of(worker, number: int):  # noqa: ANN001, ANN202
    """Ask until the retry of trial `number` comes up (trials asked before it are left running, unexpired)."""
    for _ in range(20):
        trial = worker.study.ask()
        if trial.user_attrs.get("retry_of") == number:
            return trial
    raise AssertionError(f"no retry of trial {number} was queued")


def test_a_route_lost_in_max_attempts_runs_is_failed_once_and_counted(
    write_spec: SpecWriter, pg_url: str, caplog
) -> None:  # noqa: ANN001
    from tuner.store.leases import Owner
    from tuner.study import optuna_adapter as oa
    from tuner.study.budget import count_trials

    worker = _worker(write_spec, pg_url, max_attempts=2, grace_s=60.0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    first = worker.study.ask()  # the baseline, whose worker then dies
    worker.leases.take(oa.trial_id(first), Owner("w9-gone", pid=gone.pid))
    assert worker.reaper.reap() == [first.number]
    again = _ask_retry_of(worker, first.number)
    assert again.user_attrs["attempt"] == 2 and again.user_attrs["source"] == "baseline"
    worker.leases.take(oa.trial_id(again), Owner("w9-gone", pid=gone.pid))
    before = count_trials(worker.ctx.url, worker.study_id).counted
    caplog.clear()
    with caplog.at_level("WARNING", logger="tuner.worker"):
        assert worker.reaper.reap() == [again.number]
    assert [r.getMessage() for r in caplog.records] == [
        f"trial {again.number}: its route was lost in 2 runs (run.max_attempts); failed"
    ]
    given_up = oa.trial_by_number(worker.study, again.number)
    assert given_up.state == TrialState.PRUNED and given_up.user_attrs["failure_class"] == J.GIVEN_UP
    assert "in 2 of 2 runs" in given_up.user_attrs["message"]
    assert count_trials(worker.ctx.url, worker.study_id).counted == before  # RUNNING before, counted now: same
    assert not [t for t in worker.study.get_trials() if t.user_attrs.get("retry_of") == again.number]
    assert worker.reaper.reap() == []  # failed once


def test_a_trial_past_its_deadline_is_reaped_whatever_its_heartbeat_says(
    write_spec: SpecWriter, pg_url: str, monkeypatch
) -> None:  # noqa: ANN001
    from sqlalchemy import text

    from tuner.store.db import OUTAGE
    from tuner.study import optuna_adapter as oa

    # Heartbeats and deadlines are trusted only a grace period after an outage: earlier tests in this process
    # broke connections on purpose.
    monkeypatch.setattr(OUTAGE, "since", None)
    monkeypatch.setattr(OUTAGE, "ended_at", -math.inf)

    worker = _worker(write_spec, pg_url, grace_s=60.0, trial_timeout_s=30.0)
    trial = worker.study.ask()
    fence = worker.leases.take(oa.trial_id(trial), worker.owner)  # a live owner on this host, beating
    assert worker.leases.beat(fence) and worker.reaper.reap() == []
    with get_engine(worker.ctx.url).begin() as conn:  # it began longer ago than its deadline (database clock)
        conn.execute(
            text("UPDATE tuner_leases SET started_at = started_at - :s WHERE trial_id = :t"),
            {"s": worker.spec.run.deadline_s + 1, "t": oa.trial_id(trial)},
        )
    assert worker.leases.beat(fence)  # its heartbeat thread still beats ...
    assert worker.reaper.reap() == [trial.number]  # ... and it is reaped all the same
    reaped = oa.trial_by_number(worker.study, trial.number)
    assert reaped.user_attrs["failure_class"] == J.LOST and "deadline (300 s)" in reaped.user_attrs["message"]
    assert worker.spec.run.deadline_s == 30.0 * 8 + 60.0


# -- the budget at its edge -------------------------------------------------------------------------


def test_workers_racing_at_the_budget_edge_never_exceed_it(write_spec: SpecWriter, pg_url: str, monkeypatch) -> None:  # noqa: ANN001
    import contextlib
    import threading

    from tuner.store.db import study_lock
    from tuner.study.budget import count_trials
    from tuner.worker import loop

    workers = [_worker(write_spec, pg_url, budget=1, grace_s=60.0) for _ in range(3)]

    class Lapsed:  # the study lock's session was ended by the server: every worker "holds" it at once
        def check(self) -> None:
            pass

    monkeypatch.setattr(loop, "study_lock", lambda url, study: contextlib.nullcontext(Lapsed()))
    barrier, first = threading.Barrier(len(workers)), threading.local()
    real = loop.count_trials

    def counted_together(url: str, study_id: int):  # noqa: ANN202
        counts = real(url, study_id)
        if not getattr(first, "done", False):  # every worker has counted before any of them asks
            first.done = True
            barrier.wait()
        return counts

    monkeypatch.setattr(loop, "count_trials", counted_together)
    got: list = []
    threads = [threading.Thread(target=lambda w=w: got.append(w.reserve())) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    study_id = workers[0].study_id
    assert count_trials(workers[0].ctx.url, study_id).counted <= 1  # never over, whoever asked
    handed = [t for t in workers[0].study.get_trials() if "past the budget" in t.user_attrs.get("message", "")]
    assert all(t.user_attrs["failure_class"] == J.INTERRUPTED for t in handed)
    running = [r for r in got if r[0] is not None]
    assert len(running) + len(handed) == len(workers) and len(running) <= 1
    monkeypatch.setattr(loop, "study_lock", study_lock)  # the lock is back
    monkeypatch.setattr(loop, "count_trials", real)
    if not running:  # all of them handed back: the next round, under the lock, one asks
        assert workers[0].reserve()[0] is not None
    assert count_trials(workers[0].ctx.url, study_id).counted == 1
    assert workers[1].reserve()[0] is None  # the budget is spent


def test_a_paused_worker_keeps_reaping_the_trials_of_stopped_workers() -> None:
    """While it waits out environment errors, a worker still re-queues what stopped workers hold: it is live."""
    stop = threading.Event()
    reaps: list[int] = []

    def reap() -> None:
        reaps.append(len(reaps))
        if len(reaps) == 3:
            stop.set()  # ends the pause (as SIGTERM would): the test needs no clock

    pause = EnvironmentPause("w0", stop, reap, reap_every_s=0.01)
    pause.after_tell(J.Result(status=J.ENVIRONMENT_ERROR, message="disk full"))
    assert reaps == [0, 1, 2] and pause.streak == 1
    pause.after_tell(J.Result(status=J.OK))
    assert pause.streak == 0 and len(reaps) == 3  # no pause, no reaping, after a trial that went well


def test_a_trial_whose_stopped_worker_holds_up_the_others_timings_is_reaped_while_they_wait(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, own_timing_locks: Path
) -> None:
    # A worker stopped with a host lock held shared (here by its build, which blocks): every other worker's
    # child then waits to time, up to trial_timeout_s. The waiting worker reaps meanwhile, so the stopped
    # worker's trial is re-queued long before any such wait ends.
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"1": "block"}},
            "run.budget": 4,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": 20.0,  # longer than any trial here: the other worker reserves again before it
            "run.trial_timeout_s": 900.0,
            "run.sampler": "random",
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log")
    try:
        wait_for_file(markers / "blocked-1", proc)
        stopped = int((markers / "blocked-1").read_text())  # its child holds the host lock shared, and blocks
        os.kill(stopped, signal.SIGSTOP)
        lost = _until(
            lambda: [t for t in trials(pg_url, "tiny") if t.user_attrs.get("failure_class") == "lost"],
            "the stopped worker's trial reaped",
            limit_s=300.0,
            proc=proc,
            run=(pg_url, tmp_path / "run.log"),
        )
    finally:
        os.kill(stopped, signal.SIGCONT)
    # Resumed, the worker finds its trial reaped and kills its child, still blocked: the run ends with no release.
    try:
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        (markers / "release").touch()
    assert len(lost) == 1
    ts = trials(pg_url, "tiny")
    assert len(_counted(ts)) == 4 and not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert (tmp_path / "run.log").read_text().count("was reaped while this worker was stopped") == 1
