"""Resume checks that cover every measurement setting (without refusing older studies), trial
folders per study, and the fp32 reference run isolated in a child process."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import create_engine, text

from tests.conftest import run_study
from tests.models import endless_loop_model, unknown_op_model
from tuner.store.urls import normalize_url

NEW_FIELDS = ("atol", "rtol", "gate_samples", "work_dir")


def _fingerprint(url: str) -> dict:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        fp = conn.execute(text("SELECT fingerprint FROM tuner_studies")).scalar()
    engine.dispose()
    return fp if isinstance(fp, dict) else json.loads(fp)


def test_a_study_from_before_the_new_fingerprint_fields_resumes_then_they_are_checked(cli, write_spec, pg_url) -> None:
    run_study(write_spec(**{"run.budget": 1}), pg_url)
    old = {k: v for k, v in _fingerprint(pg_url).items() if k not in NEW_FIELDS}  # as an older route-tuner stored it:
    old["timing"] = {
        k: old["objective"][k] for k in ("warmup_s", "min_repeats", "min_duration_s")
    }  # three settings apart,
    old["objective"] = old["objective"]["statistic"]  # the statistic alone
    engine = create_engine(normalize_url(pg_url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE tuner_studies SET fingerprint = :f"), {"f": json.dumps(old)})
    engine.dispose()
    run_study(write_spec(**{"run.budget": 2}), pg_url)  # unknown fields are accepted ...
    stored = _fingerprint(pg_url)
    assert set(NEW_FIELDS) <= set(stored) and "timing" not in stored  # ... and recorded from then on, in today's form
    assert {"mode", "block_s", "timing_cap_s", "target_halfwidth"} <= set(stored["objective"])
    changed = write_spec(
        **{"run.budget": 3, "data.gate_samples": 3, "objective.min_repeats": 7, "objective.block_s": 0.004}
    )
    refused = cli("run", str(changed), "--no-confirm", "--storage", pg_url)
    assert refused.returncode == 2
    err = refused.stderr.strip()
    assert len(err.splitlines()) == 1 and "gate_samples: study has 2, file has 3" in err
    assert (
        "objective.min_repeats: study has 5, file has 7" in err
        and "objective.block_s: study has 0.002, file has 0.004" in err
    )


def test_one_study_file_against_two_storages_keeps_its_trial_folders_apart(
    write_spec, pg_url, sqlite_url, tmp_path: Path
) -> None:
    spec = write_spec(**{"run.budget": 2})
    for url in (pg_url, sqlite_url):
        run_study(spec, url)
    results = sorted((tmp_path / ".tuner" / "tiny" / "trials").glob("*/*/result.json"))
    assert len(results) == 4  # nothing overwritten
    assert len({p.parent.parent for p in results}) == 2  # one folder per study


def test_a_model_that_hangs_onnx_runtime_in_the_reference_run_is_one_line(
    cli, write_spec, sqlite_url, tmp_path: Path
) -> None:
    model = endless_loop_model(tmp_path / "endless.onnx")
    spec = write_spec(**{"model.path": str(model), "run.trial_timeout_s": 3.0})
    result = cli("run", str(spec), "--no-confirm", "--storage", sqlite_url)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert (
        "the fp32 reference run with ONNX Runtime did not finish within 3 s (run.trial_timeout_s); child killed" in err
    )
    assert not list((tmp_path / ".tuner" / "tiny" / "data").glob("reference-*"))


def test_a_model_onnx_runtime_cannot_load_is_one_line(cli, write_spec, sqlite_url, tmp_path: Path) -> None:
    model = unknown_op_model(tmp_path / "unknown.onnx")
    result = cli("run", str(write_spec(**{"model.path": str(model)})), "--no-confirm", "--storage", sqlite_url)
    assert result.returncode == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "the fp32 reference run with ONNX Runtime failed: Fail:" in err and "Frobnicate" in err
