"""Durable, distributed studies: killed workers, crashing and hanging builds, exact budgets, resume checks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from optuna.trial import TrialState

from tests.conftest import run_study
from tests.helpers import start_tuner, status, trials, wait_for_file

FAULT = "tests.backends:FaultBackend"


def test_sigkilled_worker_trial_is_requeued_and_budget_is_exact(cli, write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"default": "block"}},
            "run.budget": 6,
            "run.workers": 2,
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--no-confirm", "--storage", pg_url, log=tmp_path / "run1.log")
    wait_for_file(markers / "blocked-default", proc)
    worker_pid = int((markers / "blocked-default").read_text())
    os.kill(worker_pid, signal.SIGKILL)  # mid-build: the trial's child is blocked inside build()
    proc.wait(timeout=300)
    assert proc.returncode != 0  # the run reports that a worker died
    run_study(spec, pg_url)

    ts = trials(pg_url, "tiny")
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    killed = [t for t in ts if t.user_attrs.get("failure_class") == "lost"]
    assert len(killed) == 1
    retries = [t for t in ts if t.user_attrs.get("retry_of") == killed[0].number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE
    assert retries[0].params == killed[0].system_attrs["fixed_params"]  # the baseline route, re-run
    s = status(cli("status", str(spec), "--storage", pg_url, "--json"))
    assert s["complete"] + s["pruned"] + s["failed"] == 6
    assert s["running"] == 0 and s["requeued"] == 1


def test_segfault_and_hang_are_classified_and_the_worker_goes_on(
    write_spec, sqlite_url, tmp_path: Path, own_timing_locks: Path
) -> None:
    markers = tmp_path / "markers"
    # The timeout ends the hang; the hung build holds its timing locks shared until then, so they are its own, not
    # the run's (which would hold up every other test's timings as long). CPU taken from the working trial's build
    # is not kept out of its deadline: tests on timing locks of their own time beside it at raised priority
    # (tuner.measure.priority), so 30 s, not 3.
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"0": "segfault", "1": "hang", "2": "error"}},
            "backend.space": {"precision": ["fp32"]},  # the fourth trial's route, whichever, passes the tolerance
            "run.budget": 4,
            "run.trial_timeout_s": 30.0,
        }
    )
    run_study(spec, sqlite_url)
    ts = sorted(trials(sqlite_url, "tiny"), key=lambda t: t.number)
    classes = [t.user_attrs.get("failure_class") for t in ts]
    assert classes[:3] == ["crash-signal", "timeout", "build-error"]
    assert "SIGSEGV" in ts[0].user_attrs["message"]
    assert (ts[3].state, classes[3]) == (TrialState.COMPLETE, ""), ts[3].user_attrs.get("message")
    # failures are encoded so samplers learn (PRUNED + failure constraint), never a bare FAIL
    assert all(t.state == TrialState.PRUNED and t.constraints["failure"] > 0 for t in ts[:3])


def test_three_workers_end_at_exactly_the_budget(write_spec, pg_url) -> None:
    spec = write_spec(**{"run.budget": 7, "run.workers": 3})
    run_study(spec, pg_url)
    ts = trials(pg_url, "tiny")
    assert len([t for t in ts if t.state.is_finished()]) == 7
    assert len(ts) == 7
    # resuming with a larger total budget runs only the difference
    run_study(spec, pg_url, 9)
    assert len(trials(pg_url, "tiny")) == 9


def test_sigint_marks_the_trial_in_flight_interrupted_and_requeues_it(
    cli, write_spec, sqlite_url, tmp_path: Path
) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"1": "block"}},
            "run.budget": 3,
        }
    )
    proc = start_tuner(
        "run", str(spec), "--no-confirm", "--no-confirm", "--storage", sqlite_url, log=tmp_path / "run.log"
    )
    wait_for_file(markers / "blocked-1", proc)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    ts = trials(sqlite_url, "tiny")
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    interrupted = [t for t in ts if t.user_attrs.get("failure_class") == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    waiting = [t for t in ts if t.state == TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == interrupted[0].number
    (markers / "release").write_text("")
    run_study(spec, sqlite_url)
    s = status(cli("status", str(spec), "--storage", sqlite_url, "--json"))
    assert s["complete"] + s["pruned"] + s["failed"] == 3 and s["waiting"] == 0


def test_resume_with_an_incompatible_spec_is_refused(cli, write_spec, pg_url) -> None:
    spec = write_spec(**{"run.budget": 1})
    run_study(spec, pg_url)
    changed = write_spec(
        **{"run.budget": 3, "accuracy.tolerance": 0.5, "backend.space": {"precision": ["fp32", "fp16"]}}
    )
    result = cli("run", str(changed), "--no-confirm", "--storage", pg_url)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1
    assert "tolerance" in err and "precision" in err and "[study] name" in err
    assert len(trials(pg_url, "tiny")) == 1
