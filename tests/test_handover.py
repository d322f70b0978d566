"""Handing a trial's pairing to its running child: the worker's side (a real Optuna study) and the child's."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tests.conftest import SpecWriter
from tests.helpers import wait_for_file
from tuner import job as J
from tuner.spec import load_spec
from tuner.study import attrs as A
from tuner.study.racing import BASELINE_SOURCE
from tuner.study.setup import Context
from tuner.worker.environment import environment_fault
from tuner.worker.handover import PHASE, await_pairing, hand_over, waiting
from tuner.worker.isolate import ChildHandle
from tuner.worker.jobs import make_job
from tuner.worker.pairing import Pairing


def _pairing(tmp_path: Path, wait_s: float) -> tuple[Pairing, int]:
    """A pairing over a real study whose baseline trial runs (and never ends), and the number of a trial beside it."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s")
    study.ask().set_user_attr(A.SOURCE, BASELINE_SOURCE)
    other = study.ask().number
    racer = None  # never asked: the baseline never completes
    return Pairing(study, racer, False, threading.Event(), 0.05, wait_s, lambda read: read()), other  # type: ignore[arg-type]


def test_a_baseline_that_outlasts_the_wait_is_handed_over_as_an_error(tmp_path: Path) -> None:
    pairing, number = _pairing(tmp_path, wait_s=0.2)
    path, result = tmp_path / "pairing.json", tmp_path / "result.json"
    with pairing.handed_over(number, path, result, ChildHandle()) as given:
        wait_for_file(path)  # what the child reads
        handed = json.loads(path.read_text())
    assert given.timed_out and given.error is None
    assert handed["error"].startswith("waited 0 s for the baseline trial to finish")
    assert not path.exists()  # nothing left for a later run of the trial to read


def test_a_child_gone_first_ends_the_wait_with_nothing_handed_over(tmp_path: Path) -> None:
    pairing, number = _pairing(tmp_path, wait_s=600.0)
    path = tmp_path / "pairing.json"
    with pairing.handed_over(number, path, tmp_path / "result.json", ChildHandle()) as given:
        # the child ends (a gate failure, a build error) while the baseline still runs
        assert not path.exists()  # nothing was handed over meanwhile
    assert not given.timed_out and not path.exists()


def test_the_child_knows_when_it_waits_from_its_phase(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    assert not waiting(result)
    result.write_text(J.Result(status=J.CRASH_EXIT, phase="gate").to_json())
    assert not waiting(result)
    result.write_text(J.Result(status=J.CRASH_EXIT, phase=PHASE).to_json())
    assert waiting(result)
    result.write_text('{"phase": "baseli')  # being rewritten
    assert not waiting(result)


def _job(write_spec: SpecWriter, tmp_path: Path) -> J.Job:
    """A trial's job that is handed its pairing later (the tiny study's default route)."""
    ctx = Context(load_spec(write_spec()), f"sqlite:///{tmp_path / 'x.db'}")
    late = {"pairing_path": str(tmp_path / "pairing.json"), "pairing_wait_s": 600.0}
    return make_job(ctx, ctx.space.default_route(), tmp_path / "out", **late)


def test_the_child_takes_the_pairing_handed_over_and_how_long_it_waited(write_spec: SpecWriter, tmp_path: Path) -> None:
    job = _job(write_spec, tmp_path)
    baseline = {"trial": 0, "path": "/x.onnx", "sha256": "ab", "route": {}}
    hand_over(Path(job.pairing_path), {"baseline": baseline, "incumbent": 1.2, "incumbent_high": 1.3})
    paired = await_pairing(job)
    assert paired == replace(
        job, baseline=baseline, incumbent=1.2, incumbent_high=1.3, baseline_wait_s=paired.baseline_wait_s
    )
    assert paired.baseline_wait_s >= 0.0


def test_a_wait_given_up_by_the_worker_ends_the_child_as_an_environment_error(
    write_spec: SpecWriter, tmp_path: Path
) -> None:
    job = _job(write_spec, tmp_path)
    hand_over(Path(job.pairing_path), {"error": "waited 600 s for the baseline trial to finish"})
    with pytest.raises(TimeoutError) as caught:
        await_pairing(job)
    assert environment_fault(caught.value) is not None  # ETIMEDOUT: the machine's, never the route's
    assert "waited 600 s for the baseline trial" in str(caught.value)
