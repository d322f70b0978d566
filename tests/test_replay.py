"""The replay backend: trials answered from a recorded landscape through the real worker, child and CLI."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from bench.landscape.record import Recorder
from bench.landscape.truth import Truth
from tests.conftest import run_study
from tests.helpers import trials
from tests.test_landscape import write_tiny_study
from tuner import job as J
from tuner.backends.replay.landscape import Landscape, Reduction, Round, TopK, load_landscape
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.spec import load_spec
from tuner.store.urls import normalize_url
from tuner.study.setup import Context
from tuner.worker.isolate import run_isolated
from tuner.worker.jobs import make_job


def replay_study(recorded: tuple[Path, Path], landscape: Path | None = None, **kw) -> Path:
    directory = recorded[0].parent
    return write_tiny_study(
        directory,
        backend="replay",
        options={"landscape": str(landscape or recorded[1])},
        name=kw.pop("name", "replay.toml"),
        study=kw.pop("study", "tiny-replay"),
        **kw,
    )


def recorded_accuracy(land, route) -> float:
    point = land.point(route)
    return worst(compare("cosine", land.outputs[point.outputs], land.reference, Tolerances()))


def test_replayed_trials_in_the_child_answer_as_recorded(recorded, tmp_path: Path) -> None:
    ctx = Context(load_spec(replay_study(recorded)), "")
    land = load_landscape(recorded[1])
    for i, route in enumerate(ctx.space.routes()):
        job = replace(make_job(ctx, route, tmp_path / f"t{i}" / "out"), tolerance=1.0)
        res = run_isolated(job, tmp_path / f"t{i}")
        point = land.point(route)
        samples = [s for r in point.rounds for s in r.samples_ms]
        rounds = [r.samples_ms for r in point.rounds if r.samples_ms]
        assert res.status == J.OK, res.message
        assert res.accuracy == pytest.approx(recorded_accuracy(land, route), rel=1e-9, abs=1e-12)
        assert 0.5 * min(samples) <= res.latency["median"] <= 2 * max(samples)
        # every replayed latency is one recorded round's, scaled by one factor (the round's level: paired recording)
        assert any(_one_scale(res.samples_ms, r) for r in rounds)
        assert json.loads(Path(res.artifact_path).read_text())["round"] in (0, 1)


def test_a_reduced_landscape_is_checked_saved_loaded_and_replayed(recorded, tmp_path: Path) -> None:
    """The recorder rewrites the tiny landscape from its journal (nothing to measure) with its [1, 10] outputs
    reduced to the top 4; a replay answers with the reconstructed outputs, as the recorder's check computed."""
    full = load_landscape(recorded[1])
    path = tmp_path / "reduced.json.gz"
    reduction = Reduction(top_k=4, above_bytes=0, values="float16")
    Recorder(recorded[0], path, rounds=2, reduction=reduction).run(log=lambda s: None)
    with gzip.open(path, "rt") as f:
        assert json.load(f)["format"] == "route-tuner-landscape/2"
    land = load_landscape(path)
    assert land.reduction == reduction and land.meta["enumeration"]["measured"] == 12
    assert all(isinstance(a, TopK) for v in land.outputs.values() for o in v for a in o.values())
    for got, ref in zip(land.reference, full.reference):
        assert np.array_equal(got["y"], TopK.of(ref["y"], reduction).dense())
    feeds = Context(load_spec(recorded[0]), "").feeds
    for p in land.points:
        for feed, recorded_out in zip(feeds, full.output_set(p.outputs)):
            assert np.array_equal(land.outputs_for(p, feed)["y"], TopK.of(recorded_out["y"], reduction).dense())
    check = land.meta["reduction"]["faithfulness"]
    assert check["routes"] == 6 and check["output_sets"] == len(land.outputs) == len(full.outputs)
    was, now = Truth(full, tolerance=0.001), Truth(land, tolerance=0.001)
    for key, c in check["per_output_set"].items():  # the study's judge agrees with the benchmark's truth
        assert c["full"] == pytest.approx(list(was.accuracy[key]), rel=1e-9, abs=1e-12)
        assert c["reduced"] == pytest.approx(list(now.accuracy[key]), rel=1e-9, abs=1e-12)
    passes = [
        {max(c[k]) <= 0.001 for k in ("full", "reduced", "reduced_vs_full_reference")}
        for c in (check["per_output_set"][p.outputs] for p in land.points)
    ]
    assert check["verdicts_changed"] == sum(len(v) > 1 for v in passes)
    ctx = Context(load_spec(replay_study(recorded, path, name="reduced.toml", study="reduced")), "")
    for i, route in enumerate(ctx.space.routes()[:2]):  # through the real child, against the study's own reference
        res = run_isolated(replace(make_job(ctx, route, tmp_path / f"t{i}" / "out"), tolerance=1.0), tmp_path / f"t{i}")
        assert res.status == J.OK, res.message
        expected = check["per_output_set"][land.point(route).outputs]["reduced_vs_full_reference"][1]
        assert res.accuracy == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_replayed_failures_end_the_child_as_recorded(recorded, tmp_path: Path) -> None:
    land = load_landscape(recorded[1])
    fails = [
        Round(J.BUILD_ERROR, "build", "scripted: no kernel"),
        Round(J.CRASH_SIGNAL, "build", "child died of SIGSEGV during build"),
        Round(J.RUNTIME_ERROR, "gate", "scripted: bad output"),
        Round(J.TIMEOUT, "time", "no result after 600 s"),
    ]
    points = [replace(p, rounds=(f,)) for p, f in zip(land.points, fails)] + land.points[4:]
    path = tmp_path / "failing.json.gz"
    Landscape(land.meta, points, land.feeds, land.reference, land.outputs).save(path)
    ctx = Context(load_spec(replay_study(recorded, path, name="failing.toml", study="failing")), "")
    for i, (point, fail) in enumerate(zip(points, fails)):
        job = replace(make_job(ctx, point.route, tmp_path / f"t{i}" / "out"), tolerance=1.0, timeout_s=3.0)
        res = run_isolated(job, tmp_path / f"t{i}")
        assert res.status == fail.status, res.message
    assert (
        "SIGSEGV"
        in run_isolated(make_job(ctx, points[1].route, tmp_path / "again" / "out"), tmp_path / "again").message
    )


def test_tuner_run_with_replay_on_postgres(recorded, pg_url: str) -> None:
    spec = replay_study(recorded, **{"name": "run.toml", "study": "tiny-replay-run"})
    run_study(spec, pg_url, 6)
    land = load_landscape(recorded[1])
    ts = trials(pg_url, "tiny-replay-run")
    complete = [t for t in ts if t.state == TrialState.COMPLETE]
    assert len(ts) == 6 and complete
    base = [s for r in land.point(ts[0].params).rounds for s in r.samples_ms]  # trial 0: the default route
    spread = max(base) / min(base)
    for t in complete:
        samples = [s for r in land.point(t.params).rounds for s in r.samples_ms]
        # the study value is the default's latency over the paired speedup: each within its recorded range
        assert min(samples) / spread <= t.value <= max(samples) * spread
        assert t.user_attrs["accuracy"]["value"] == pytest.approx(
            recorded_accuracy(land, t.params), rel=1e-9, abs=1e-12
        )
    for t in ts:  # int8 breaks the 0.001 cosine tolerance: the gate prunes it, as with the real backend; the paired
        if (
            t.state == TrialState.PRUNED
        ):  # measurement (on the replay's virtual clock) stops routes slower than the incumbent
            assert (
                t.params["precision"] == "int8_dynamic"
                and t.user_attrs["failure_class"] == J.GATE_FAILED
                or t.user_attrs["failure_class"] == J.SLOW
            )
    assert all(t.user_attrs["paired"] for t in complete if t.user_attrs.get("source") != "baseline")
    attrs = optuna.load_study(study_name="tiny-replay-run", storage=normalize_url(pg_url)).user_attrs
    assert attrs["backend"] == "replay" and attrs["landscape_backend"]["name"] == "onnxruntime"


def test_replay_refuses_another_model_and_a_missing_landscape(cli, recorded, tmp_path: Path) -> None:
    spec = replay_study(recorded)
    other = spec.parent / "other"
    other.mkdir(exist_ok=True)
    text = spec.read_text()
    from tests.models import conv_model

    conv_model(other / "tiny.onnx", seed=5)
    (other / "s.toml").write_text(text.replace(str(recorded[0].parent / "tiny.onnx"), str(other / "tiny.onnx")))
    done = cli("space", str(other / "s.toml"))
    assert (
        done.returncode == 2
        and "recorded for another model" in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    )
    (other / "m.toml").write_text(text.replace(str(recorded[1]), str(tmp_path / "nope.json.gz")))
    done = cli("space", str(other / "m.toml"))
    assert done.returncode == 2 and "nope.json.gz: not found" in done.stderr


def _one_scale(replayed: list[float], recorded: tuple[float, ...]) -> bool:
    """Whether `replayed` are values of `recorded` times one common factor."""
    for x in recorded:
        c = replayed[0] / x
        if all(any(abs(s / c - y) <= 1e-4 * y for y in recorded) for s in replayed):
            return True
    return False
