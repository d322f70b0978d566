"""`tuner gc`: a dry run by default, then deletion of only what no kept trial, study or route needs."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from tests.conftest import tuner
from tests.helpers import trials
from tuner.store.urls import normalize_url
from tuner.study.outcome import is_feasible


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def _artifact(work: Path, t: optuna.trial.FrozenTrial) -> list[Path]:
    sha = t.user_attrs.get("artifact_sha256")
    return list((work / "artifacts").glob(f"{sha}*")) if sha else []


def test_gc_lists_by_default_and_deletes_only_unneeded_files_with_yes(write_spec, pg_url, tmp_path: Path) -> None:
    spec = write_spec(**{"run.budget": 10, "run.sampler": "random", "run.keep_best": 1, "run.racing": False})
    assert tuner("run", str(spec), "--no-confirm", "--storage", pg_url).returncode == 0
    work = tmp_path / ".tuner" / "tiny"
    ts = sorted(trials(pg_url, "tiny"), key=lambda t: t.number)
    feasible = sorted((t for t in ts if is_feasible(t)), key=lambda t: (t.value, t.number))
    baseline = ts[0]
    taken = {baseline.user_attrs["artifact_sha256"], feasible[0].user_attrs["artifact_sha256"]}
    with_artifact = [t for t in reversed(feasible + ts) if t.user_attrs.get("artifact_sha256") not in taken | {None, ""}]
    confirmed = with_artifact[0]  # a later-ranked trial that a confirmation measured
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    study.set_user_attr("confirmation", {"candidates": [{"trial": confirmed.number}], "trial": confirmed.number,  # as confirm stores it
                                         "message": "no significant speedup", "study_best_trial": feasible[0].number})
    kept = {baseline.number, feasible[0].number, confirmed.number}
    doomed = {p for t in ts if t.number not in kept for p in _artifact(work, t)} - {p for t in ts if t.number in kept for p in _artifact(work, t)}
    assert doomed  # the study left artifacts nobody needs

    before = _files(work)
    dry = tuner("gc", str(spec), "--storage", pg_url)
    assert dry.returncode == 0, dry.stderr
    assert _files(work) == before  # a dry run removes nothing ...
    keeping = next(line for line in dry.stdout.splitlines() if line.startswith("keeping"))
    assert f"#{baseline.number} baseline" in keeping and "best feasible #1" in keeping and f"#{confirmed.number} confirmed" in keeping
    assert f"#{feasible[0].number} " in keeping and len(keeping.split("#")) - 1 >= 3
    for p in doomed:  # ... and lists each file with its size
        assert str(p.relative_to(work)) in dry.stdout
    assert "dry run: nothing was removed" in dry.stdout

    done = tuner("gc", str(spec), "--storage", pg_url, "--yes")
    assert done.returncode == 0, done.stderr
    after = _files(work)
    assert not any(p.exists() for p in doomed)
    for t in ts:
        if t.number in kept:
            assert all(p.exists() for p in _artifact(work, t))
            assert (next((work / "trials").iterdir()) / f"{t.number:05d}" / "result.json").exists()
    untouched = ("variants/", "data/", "optuna-artifacts/")
    assert {k: v for k, v in before.items() if k.startswith(untouched)} == {k: v for k, v in after.items() if k.startswith(untouched)}
    assert any(k.startswith("variants/") for k in after)  # precision variants are kept for the routes still to come
    export = tuner("best", str(spec), "--storage", pg_url, "--export", str(tmp_path / "out"), "--trial", str(feasible[0].number))
    assert export.returncode == 0, export.stderr
    again = tuner("gc", str(spec), "--storage", pg_url)
    assert "would remove 0 item(s), 0 B" in again.stdout


def test_a_size_cap_collects_after_the_run_and_never_touches_a_running_study(write_spec, pg_url, tmp_path: Path) -> None:
    spec = write_spec(**{"run.budget": 6, "run.sampler": "random", "run.keep_best": 1, "run.max_disk_mb": 0.001})
    run = tuner("run", str(spec), "--no-confirm", "--storage", pg_url)
    assert run.returncode == 0, run.stderr
    assert "gc: work dir" in run.stderr and "exceeds run.max_disk_mb (0.001 MB): removed" in run.stderr
    assert "what is kept is still" in run.stderr
    work = tmp_path / ".tuner" / "tiny"
    ts = trials(pg_url, "tiny")
    best = min((t for t in ts if is_feasible(t)), key=lambda t: (t.value, t.number))
    kept_shas = {t.user_attrs.get("artifact_sha256") for t in ts if t.number in (0, best.number)}
    assert {p.name[:64] for p in (work / "artifacts").iterdir()} == kept_shas
    # A trial RUNNING (a worker elsewhere): deleting is refused with one line.
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    study._storage.create_new_trial(study._study_id, template_trial=optuna.trial.create_trial(state=TrialState.RUNNING, params={}, distributions={}))
    refused = tuner("gc", str(spec), "--storage", pg_url, "--yes")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "1 RUNNING trial(s)" in refused.stderr
