"""A trial's lifecycle under stopped workers and held locks: waits are never the route's, nothing wedges.

Real PostgreSQL, real workers and children, real signals (SIGSTOP/SIGCONT); every wait is for an
event the system announces (a marker file, a trial's state, a lock-wait report).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.conftest import REPO, SpecWriter
from tests.helpers import start_tuner, trials, wait_for_file
from tuner import job as J
from tuner.measure.exclusive import HOST, DeviceLock, LockWaitExpired, private_dir, waited
from tuner.spec import load_spec
from tuner.study.setup import Context
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job

FAULT = "tests.backends:FaultBackend"


def _until(condition, what: str, limit_s: float = 240.0, proc: subprocess.Popen | None = None):  # noqa: ANN001, ANN201
    """Poll `condition()` until it returns something true (an event the system under test records); return it."""
    deadline = time.monotonic() + limit_s
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit_s} s")
        time.sleep(0.1)


def _counted(ts: list) -> list:  # noqa: ANN001
    return [t for t in ts if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def test_a_stopped_baseline_worker_is_reaped_and_the_study_ends_at_its_budget(
    write_spec: SpecWriter, pg_url: str, tmp_path: Path, own_timing_locks: Path
) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "block"}},
            "run.budget": 4,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": 4.0,
            "run.sampler": "random",  # cheap to ask: the study's time goes to the lifecycle under test
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log")
    try:
        wait_for_file(markers / "blocked-0", proc)
        stopped = int((markers / "blocked-0").read_text())  # the worker of trial 0, the baseline, mid-build
        os.kill(stopped, signal.SIGSTOP)
        (markers / "release").touch()  # its child goes on (it is not stopped), finishes and exits; its result waits
        # The other worker reaps the baseline, re-runs it and spends the whole budget while the first is frozen.
        _until(lambda: len(_counted(trials(pg_url, "tiny"))) >= 4, "the budget spent", proc=proc)
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
