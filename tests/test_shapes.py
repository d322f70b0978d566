"""Shapes as deployed ([[objective.shapes]]) and the deployment's share of the machine ([objective] cores)."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from optuna_dashboard import get_note

from tests.conftest import REPO, run_study
from tests.helpers import trials
from tests.models import conv_model
from tuner.errors import SpecError
from tuner.measure.speedup import Speedup, mixed_cycles, weighted_speedup
from tuner.spec import load_spec
from tuner.store.cache import ResultStore
from tuner.store.urls import normalize_url
from tuner.study.setup import Context

X = [1, 3, 16, 16]  # the tiny model's only input, fixed by the graph


@pytest.mark.parametrize(
    ("shapes", "error"),
    [
        ([{"inputs": {"z": X}}], "objective.shapes[0].inputs.z: the model has no such input; its inputs are x"),
        ([{"inputs": {"x": [1, 3, 16]}}], "objective.shapes[0].inputs.x: [1, 3, 16] has rank 3; the model's input"),
        ([{"inputs": {"x": [8, 3, 16, 16]}}], "objective.shapes[0].inputs.x: dimension 0 is fixed at 1 by the model"),
        ([{"inputs": {"x": X}, "weight": 0}], "objective.shapes[0].weight: expected a number > 0, got 0"),
        ([{"inputs": {"x": X}, "size": 2}], "objective.shapes[0].size: unknown field"),
    ],
)
def test_a_shape_the_model_cannot_take_is_one_line_naming_the_field(write_spec, shapes, error) -> None:
    with pytest.raises(SpecError) as exc:
        load_spec(write_spec(**{"objective.shapes": shapes}))
    assert error in str(exc.value) and "\n" not in str(exc.value)


def test_a_study_without_shapes_is_timed_at_its_model_shapes_only(write_spec) -> None:
    spec = load_spec(write_spec())
    ctx = Context(spec, "sqlite://")
    assert spec.objective.shapes == () and ctx.model_info.served() == [({"x": (1, 3, 16, 16)}, 1.0)]


def test_the_weighted_geometric_mean_and_its_interval_from_the_shapes() -> None:
    a, b = Speedup(2.0, 1.8, 2.2, 0.95, 10), Speedup(1.0, 0.9, 1.1, 0.96, 12)
    s = weighted_speedup([a, b], [3.0, 1.0])
    assert s.estimate == pytest.approx(2.0**0.75) and s.rounds == 10 and s.confidence == 0.95
    assert s.low < s.estimate < s.high and s.halfwidth < min(a.halfwidth, b.halfwidth)  # independent: narrower
    assert weighted_speedup([a], [1.0]) == Speedup(2.0, 1.8, 2.2, 0.95, 10)
    assert mixed_cycles([[0.4, 0.2, 0.6], [0.0, 0.2]], [1.0, 1.0]) == pytest.approx([0.2, 0.2])


def test_a_two_shape_study_of_the_bundled_model_runs_and_best_lists_every_shape(
    cli, tmp_path: Path, sqlite_url
) -> None:
    models = REPO / "models"
    spec = tmp_path / "effnet.toml"
    spec.write_text(f"""[study]
name = "effnet-shapes"
[model]
path = "{models / "efficientnet_lite0.onnx"}"
inputs.images = {{ shape = [1, 3, 224, 224] }}
[data]
file = "{models / "efficientnet_lite0_val.npz"}"
samples = 1
gate_samples = 1
[accuracy]
metric = "top1_mismatch"
tolerance = 1.0
[objective]
warmup_s = 0.0
min_repeats = 5
min_duration_s = 0.0
timing_cap_s = 0.3
target_halfwidth = 0.5
contention = "shared"
[[objective.shapes]]
inputs.images = [1, 3, 224, 224]
weight = 0.7
[[objective.shapes]]
inputs.images = [8, 3, 224, 224]
weight = 0.3
[backend]
name = "onnxruntime"
space = {{ precision = ["fp32"], graph_optimization_level = ["all"], execution_mode = ["sequential"] }}
[run]
budget = 2
racing = false
trial_timeout_s = 300
""")
    run_study(spec, sqlite_url)
    done = trials(sqlite_url, "effnet-shapes")
    candidate = next(t for t in done if t.user_attrs.get("source") != "baseline")
    assert [s["inputs"]["images"][0] for s in candidate.user_attrs["shapes"]] == [1, 8]
    best = cli("best", str(spec), "--storage", sqlite_url, "--json")
    assert best.returncode == 0, best.stderr[-2000:]
    doc = json.loads(best.stdout)
    assert [(s["inputs"], s["weight"]) for s in doc["shapes"]] == [
        ({"images": [1, 3, 224, 224]}, 0.7),
        ({"images": [8, 3, 224, 224]}, 0.3),
    ]
    if doc["trial"] != doc["baseline_trial"]:
        assert all(s["speedup"] > 0 and s["default_ms"] > 0 and s["route_ms"] > 0 and s["ci"] for s in doc["shapes"])
    assert doc["machine_share"] == {"contention": "shared", "cores": None, "affinity": doc["machine_share"]["affinity"]}
    assert all(t.user_attrs["shapes"][1]["route_ms"] > t.user_attrs["shapes"][0]["route_ms"] for t in done)


def _two_shapes(write_spec, tmp_path: Path) -> Path:
    """The tiny model with a dynamic batch, served at batch 1 (weight 0.7) and 4 (0.3); every route the same engine,
    three trials."""
    return write_spec(
        **{
            "model.path": str(conv_model(tmp_path / "batched.onnx", batch="N")),
            "model.inputs": {"x": {"shape": X}},
            "objective.shapes": [{"inputs": {"x": X}, "weight": 0.7}, {"inputs": {"x": [4, 3, 16, 16]}, "weight": 0.3}],
            "backend.name": "tests.backends:SameEngineBackend",
            "run.budget": 3,
            "run.startup_trials": 3,
        }
    )


@pytest.mark.slow
def test_a_two_shape_confirmation_says_each_shape_and_the_share_of_the_machine(
    cli, write_spec, pg_url, tmp_path: Path
) -> None:
    """The tiny model with a dynamic batch at two shapes, every route the same engine: the confirmation pools each
    shape apart, and the verdict, the note and the report say each shape's speedup and how the study was timed."""
    spec = _two_shapes(write_spec, tmp_path)
    ran = cli("run", str(spec), "--storage", pg_url, "--confirm-top-k", "1", "--confirm-rounds", "3")
    assert ran.returncode == 0, ran.stderr[-3000:]
    doc = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url)).user_attrs["confirmation"]
    (row,) = doc["candidates"]
    assert [(s["inputs"]["x"][0], s["weight"]) for s in row["shapes"]] == [(1, 0.7), (4, 0.3)], row
    assert all(s["ci"][0] <= s["speedup"] <= s["ci"][1] and s["confidence"] == row["confidence"] for s in row["shapes"])
    assert all(s["route_ms"] > 0 and s["default_ms"] > 0 for s in row["shapes"])
    assert "; per shape: x 1x3x16x16 " in doc["message"] and ", x 4x3x16x16 " in doc["message"], doc["message"]
    timed = "The study was timed beside other work (contention shared: recorded, not acted on), every core allowed."
    assert timed in ran.stdout, ran.stdout  # tuner run's last lines
    best = cli("best", str(spec), "--storage", pg_url)
    assert best.returncode == 0, best.stderr[-2000:]
    headline = best.stdout.splitlines()[0]
    assert " Per shape: x 1x3x16x16 " in headline and timed in headline, best.stdout
    note = get_note(optuna.load_study(study_name="tiny", storage=normalize_url(pg_url)))
    assert " Per shape: x 1x3x16x16 " in note
    report = cli("report", str(spec), "--storage", pg_url, "--out", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr[-2000:]
    html = (tmp_path / "report" / "report.html").read_text()
    assert f"<h2>Per input shape: trial {row['trial']}</h2>" in html and "<td>x 4x3x16x16</td><td>0.3</td>" in html


def test_racing_pools_each_shape_of_a_re_measured_trial_and_the_verdict_says_racing_s_figures(
    cli, write_spec, pg_url, tmp_path: Path
) -> None:
    """The tiny model with a dynamic batch at two shapes, racing on, no confirmation: each re-measured trial's racing
    entry pools every uncontended paired measurement of it shape by shape, as it pools them all."""
    spec = _two_shapes(write_spec, tmp_path)
    run_study(spec, pg_url)
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    raced = {int(n): e for n, e in study.user_attrs["racing"].items() if e.get("remeasured")}
    assert raced, study.user_attrs["racing"]
    kept = ResultStore(normalize_url(pg_url)).measurements("tiny")
    for number, entry in raced.items():
        pooled = [
            m
            for m in kept
            if m.trial_number == number
            and m.kind in ("trial", "race")
            and (m.stats.get("paired") or {}).get("shapes")
            and not m.stats["paired"].get("contended")
        ]
        assert len([m for m in pooled if m.kind == "race"]) == entry["remeasured"]
        rows = entry["shapes_refined"]
        assert [(s["inputs"]["x"][0], s["weight"]) for s in rows] == [(1, 0.7), (4, 0.3)], rows
        for s in rows:
            assert s["measurements"] == len(pooled) and s["confidence"] == 0.95
            assert s["ci"][0] <= s["speedup"] <= s["ci"][1] and s["route_ms"] > 0 and s["default_ms"] > 0
    best = cli("best", str(spec), "--storage", pg_url, "--json")
    assert best.returncode == 0, best.stderr[-2000:]
    doc = json.loads(best.stdout)
    if doc["trial"] in raced:  # the verdict is about a re-measured trial: racing's per-shape figures, said so
        rows = raced[doc["trial"]]["shapes_refined"]
        assert doc["shapes_from"] == "racing" and [s["ci"] for s in doc["shapes"]] == [s["ci"] for s in rows]
        assert " Per shape, racing's re-measurements pooled: x 1x3x16x16 " in doc["headline"], doc["headline"]


def test_a_study_with_one_core_times_every_route_on_one_core_and_never_proposes_more_threads(
    write_spec, sqlite_url
) -> None:
    spec = write_spec(**{"objective.cores": 1, "run.budget": 4})
    space = Context(load_spec(spec), "sqlite://").space
    assert set(space.param("intra_op_threads").choices) == {0, 1}
    assert set(space.param("inter_op_threads").choices) == {0, 1}
    run_study(spec, sqlite_url)
    done = trials(sqlite_url, "tiny")
    timed = [t for t in done if "affinity" in t.user_attrs]
    assert timed and len(timed) == len([t for t in done if t.user_attrs.get("latency_ms")])
    assert all(len(t.user_attrs["affinity"]) == 1 for t in timed)  # read inside the child, during its timing
    assert all(t.params.get("intra_op_threads", 0) <= 1 and t.params.get("inter_op_threads", 0) <= 1 for t in done)
