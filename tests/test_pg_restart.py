"""A PostgreSQL restart in the middle of a two-worker study: the workers retry and the study completes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from optuna.trial import TrialState

from tests.helpers import start_tuner, trials, wait_for_file

FAULT = "tests.backends:FaultBackend"


def _restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True, timeout=120)


@pytest.mark.restarts_postgres
def test_study_survives_a_postgres_restart(write_spec, pg_url, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    spec = write_spec(
        **{
            "backend.name": FAULT,
            "backend.options": {"marker_dir": str(markers), "faults": {"2": "block"}},
            "run.budget": 8,
            "run.workers": 2,
            "run.heartbeat_s": 0.5,
            "run.grace_s": 60.0,
        }
    )
    proc = start_tuner("run", str(spec), "--no-confirm", "--storage", pg_url, log=tmp_path / "run.log")
    wait_for_file(markers / "blocked-2", proc)
    _restart_postgres()  # every pooled connection of both workers and the main process is now dead
    (markers / "release").write_text("")
    assert proc.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
    ts = trials(pg_url, "tiny")
    assert not [t for t in ts if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    finished = [
        t for t in ts if t.state.is_finished() and t.user_attrs.get("failure_class") not in ("lost", "interrupted")
    ]
    assert len(finished) == 8
    assert len({t.number for t in ts}) == len(ts)
