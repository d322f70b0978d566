"""Study behaviour end to end on the real ONNX Runtime backend: feasibility, baseline, reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from optuna.trial import TrialState

from tests.conftest import REPO, run_study
from tests.helpers import status, trials

SPACE = {
    "precision": ["fp32", "int8_static", "int8_dynamic"],
    "graph_optimization_level": ["all"],
    "execution_mode": ["sequential"],
    "intra_op_threads": [0],
    "cpu_mem_arena": [True],
    "mem_pattern": [True],
}


def test_the_fastest_route_breaks_the_tolerance_and_is_never_reported_best(cli, write_spec, pg_url) -> None:
    spec = write_spec(
        **{
            "backend.name": "tests.backends:SkewedBackend",
            "backend.space": SPACE,
            "run.budget": 8,
            "data.gate_samples": 4,
            "run.sampler": "random",
        }
    )
    run_study(spec, pg_url)
    ts = [t for t in trials(pg_url, "tiny") if t.state.is_finished()]
    int8 = [t for t in ts if str(t.params.get("precision", "")).startswith("int8")]
    assert int8 and all(t.user_attrs["failure_class"] in ("accuracy-gate", "accuracy") for t in int8)
    assert all(t.state == TrialState.PRUNED and t.constraints["accuracy"] > 0 for t in int8)
    best = json.loads(cli("best", str(spec), "--storage", pg_url, "--json").stdout)
    assert set(best) >= {"study", "trial", "route", "value", "baseline_value", "speedup", "accuracy", "feasible"}
    assert best["verdict"] == "unconfirmed" and best["export_trial"] is None  # --no-confirm: nothing is confirmed
    assert best["speedup"] == best["study_speedup"] == best["baseline_value"] / best["value"]
    assert best["speedup_ci"] == (
        [1.0, 1.0] if best["trial"] == best["baseline_trial"] else None
    )  # no interval from one unpaired trial each
    assert best["feasible"] is True and best["route"]["precision"] == "fp32"
    assert best["accuracy"]["value"] <= best["accuracy"]["tolerance"]
    s = status(cli("status", str(spec), "--storage", pg_url, "--json"))
    assert set(s) >= {
        "study",
        "budget",
        "complete",
        "pruned",
        "failed",
        "running",
        "waiting",
        "feasible",
        "best_value",
        "baseline_value",
    }
    assert s["budget"] == 8 and s["complete"] + s["pruned"] + s["failed"] == 8
    assert s["best_value"] == best["value"]
    assert {k: s[k] for k in ("verdict", "speedup", "speedup_ci", "study_speedup")} == {
        k: best[k] for k in ("verdict", "speedup", "speedup_ci", "study_speedup")
    }


def test_baseline_is_the_first_trial_once_across_restarts(write_spec, sqlite_url) -> None:
    spec = write_spec(**{"run.budget": 2})
    run_study(spec, sqlite_url)
    run_study(spec, sqlite_url, 3)
    ts = sorted(trials(sqlite_url, "tiny"), key=lambda t: t.number)
    baselines = [t for t in ts if t.user_attrs.get("source") == "baseline"]
    assert [t.number for t in baselines] == [0]
    assert ts[0].params["precision"] == "fp32" and ts[0].params["graph_optimization_level"] == "all"


def test_export_writes_engine_route_and_reproduction(cli, write_spec, sqlite_url, tmp_path) -> None:
    spec = write_spec(**{"run.budget": 2})
    run = subprocess.run(
        [sys.executable, "-m", "tuner", "run", str(spec), "--storage", sqlite_url, "--no-confirm"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stdout
    lines = run.stdout.splitlines()  # progress (stderr) and result (stdout) in one stream, as in a log file or CI
    assert any(line.startswith("Not confirmed") for line in lines), run.stdout  # the headline starts its own line
    out = tmp_path / "export"
    refused = cli(
        "best", str(spec), "--storage", sqlite_url, "--export", str(out)
    )  # unconfirmed: not exported unless asked for
    assert (
        refused.returncode == 2
        and "not exporting" in refused.stderr
        and "--trial" in refused.stderr
        and not out.exists()
    )
    number = json.loads(cli("best", str(spec), "--storage", sqlite_url, "--json").stdout)["trial"]
    result = cli("best", str(spec), "--storage", sqlite_url, "--export", str(out), "--trial", str(number))
    assert result.returncode == 0, result.stderr
    doc = json.loads((out / "best.json").read_text())
    route = json.loads((out / "route.json").read_text())
    assert (
        route == doc["exported"]["route"]
        and doc["exported"]["trial"] == number
        and "--trial" in doc["exported"]["reason"]
    )
    import hashlib

    assert hashlib.sha256((out / "engine.onnx").read_bytes()).hexdigest() == doc["exported"]["artifact_sha256"]
    script = (out / "reproduce.sh").read_text()
    assert "tuner build" in script and "route.json" in script
    rebuilt = cli("build", str(spec), "--route", str(out / "route.json"), "--out", str(tmp_path / "rebuilt"))
    assert rebuilt.returncode == 0, rebuilt.stderr + rebuilt.stdout
    assert (tmp_path / "rebuilt" / "engine.onnx").exists()
