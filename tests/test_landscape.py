"""Landscape recording (real ONNX Runtime builds in real child processes) and the strategy benchmark on it."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.landscape.record import Recorder
from bench.landscape.score import built_curve, score, summarise
from bench.landscape.simulate import Step
from bench.landscape.strategies import STRATEGIES, Run
from bench.landscape.truth import Truth
from tests.conftest import REPO
from tests.models import conv_model
from tuner import job as J
from tuner.backends.onnxruntime.quant_space import recommendation
from tuner.backends.replay.landscape import Reduction, TopK, dense_outputs, load_landscape, reduce_outputs
from tuner.backends.replay.space import replay_space
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.space import route_hash
from tuner.spec import load_spec
from tuner.spec.toml import dumps
from tuner.study.setup import Context

SPACE = {
    "precision": ["fp32", "int8_dynamic"],
    "graph_optimization_level": ["all", "disabled"],
    "execution_mode": ["sequential"],
    "intra_op_threads": [0],
    "cpu_mem_arena": [True],
    "mem_pattern": [True],
    # the int8 knobs at their defaults (reduce_range's follows this CPU's VNNI) but per-channel
    # (ONNX Runtime's int8 routes grew them; 50 routes otherwise)
    "quant_types": ["U8S8"],
    "quant_format": ["qdq"],
    "activation_symmetric": [False],
    "weight_symmetric": [True],
    "weight_type": ["S8"],
    "reduce_range": [recommendation().reduce_range],
    "calibration": ["minmax"],
    "percentile": [99.999],
    "quant_ops": ["all"],
    "fp32_nodes": [0],
    "int8_graph_level": ["all"],
}  # 6 routes


def write_tiny_study(
    directory: Path,
    backend: str = "onnxruntime",
    options: dict | None = None,
    name: str = "study.toml",
    study: str = "tiny-landscape",
    **space: list,
) -> Path:
    """A study on the tiny CNN (same bytes every time) whose space is SPACE (6 routes)."""
    directory.mkdir(parents=True, exist_ok=True)
    model = conv_model(directory / "tiny.onnx")
    doc = {
        "study": {"name": study},
        "model": {"path": str(model)},
        "data": {"samples": 4, "gate_samples": 2},
        "accuracy": {"metric": "cosine", "tolerance": 0.001},
        "objective": {
            "warmup_s": 0.0,
            "min_repeats": 5,
            "min_duration_s": 0.01,
            "block_s": 0.002,
            "timing_cap_s": 0.3,
            "target_halfwidth": 0.1,
        },  # short adaptive timings, as in conftest's study files
        "backend": {"name": backend, "options": options or {}, "space": {**SPACE, **space}},
        "run": {"budget": 4, "trial_timeout_s": 60.0},
    }
    path = directory / name
    path.write_text(dumps(doc))
    return path


def record_tiny_landscape(directory: Path, rounds: int = 2) -> tuple[Path, Path]:
    """Record the tiny study's 6 routes with real ONNX Runtime builds. Returns (study file, landscape file)."""
    spec = write_tiny_study(directory)
    out = directory / "tiny.json.gz"
    Recorder(spec, out, rounds).run(log=lambda s: None)
    return spec, out


def test_every_route_is_recorded_with_outputs_samples_and_environment(recorded) -> None:
    spec_path, path = recorded
    ctx = Context(load_spec(spec_path), "")
    land = load_landscape(path)
    with gzip.open(path, "rt") as f:
        assert json.load(f)["format"] == "route-tuner-landscape/1"
    assert sorted(p.key for p in land.points) == sorted(route_hash(r) for r in ctx.space.routes())
    assert land.meta["enumeration"] == {
        "space_routes": 6,
        "recorded_routes": 6,
        "subset_seed": None,
        "rounds": 2,
        "rounds_complete": 2,
        "measured": 12,
        "routes_with_differing_outputs": 0,
    }
    assert land.meta["environment"]["device"]["cores"] >= 1 and land.meta["backend"]["name"] == "onnxruntime"
    for p in land.points:
        assert [r.status for r in p.rounds] == [J.OK, J.OK]
        assert all(len(r.samples_ms) >= 5 and min(r.samples_ms) > 0 for r in p.rounds)
        assert len(land.outputs[p.outputs]) == 4  # one output set per feed
    # identical engines share one stored output set: threads never change numerics, variants do
    assert 2 <= len(land.outputs) <= 4


@pytest.mark.parametrize("values", ["float16", "float32"])
def test_a_reduced_record_is_the_top_k_per_position_and_zero_elsewhere(values: str) -> None:
    rng = np.random.default_rng(0)
    probs = rng.random((2, 5, 300)).astype(np.float32)  # no ties
    wide = rng.standard_normal((1, 2, 40000)).astype(np.float32)  # a last axis beyond int16
    reduction = Reduction(top_k=4, above_bytes=1000, values=values)
    for a, index in ((probs, np.int16), (wide, np.int32)):
        stored = TopK.of(a, reduction)
        assert stored.indices.dtype == index and stored.values.dtype == np.dtype(values)
        rebuilt = stored.dense()
        assert rebuilt.dtype == a.dtype and rebuilt.shape == a.shape
        top = np.zeros(a.shape, dtype=bool)
        np.put_along_axis(top, np.argsort(a, axis=-1)[..., -4:], True, axis=-1)
        assert np.array_equal(rebuilt[top], a[top].astype(values).astype(a.dtype))
        assert not rebuilt[~top].any()
    small, ints = np.ones((1, 10), np.float32), np.arange(600, dtype=np.int64).reshape(2, 300)
    kept = reduce_outputs({"p": probs, "small": small, "ints": ints}, reduction)
    assert isinstance(kept["p"], TopK) and kept["small"] is small and kept["ints"] is ints  # only large float arrays
    assert np.array_equal(dense_outputs(kept)["p"], TopK.of(probs, reduction).dense())
    assert reduce_outputs({"p": probs}, None)["p"] is probs


def test_recorded_outputs_reproduce_the_childs_own_accuracy(recorded) -> None:
    spec_path, path = recorded
    ctx = Context(load_spec(spec_path), "")
    land = load_landscape(path)
    journal = [json.loads(line) for line in (ctx.work_dir / "landscape" / "journal.jsonl").read_text().splitlines()[1:]]
    for entry in journal:
        point = land.point(entry["route"])
        again = worst(compare("cosine", land.outputs[point.outputs], land.reference, Tolerances()))
        assert again == pytest.approx(entry["accuracy"], rel=1e-9, abs=1e-12)
    int8 = [e["accuracy"] for e in journal if e["route"]["precision"] == "int8_dynamic"]
    assert min(int8) > 0  # quantization really changed the outputs that were captured


def test_tests_of_the_recorded_landscape_share_one_worker(recorded, request: pytest.FixtureRequest) -> None:
    """Under `make test` (pytest-xdist, --dist loadgroup) they carry their group, so the landscape is recorded
    once per run.

    pytest 9.2 silently dropped the group (a known pytest-xdist bug, #1386 in its tracker), hence pytest < 9.2
    in the dev extra.
    """
    if request.config.getoption("dist", "no") == "no" and not request.config.getoption("loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@recorded")


def test_recording_resumes_from_its_journal(recorded) -> None:
    spec_path, path = recorded
    before = load_landscape(path).meta["enumeration"]["measured"]
    Recorder(spec_path, path, rounds=2).run(log=lambda s: None)  # nothing left to do
    assert load_landscape(path).meta["enumeration"]["measured"] == before == 12


def test_failures_are_recorded_with_their_class_and_deterministic_ones_not_rerun(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the children import the stand-in backend from tests/
    spec = write_tiny_study(
        tmp_path,
        backend="tests.backends:FaultBackend",
        options={"marker_dir": str(tmp_path / "markers"), "faults": {"0": "segfault", "1": "error"}},
        graph_optimization_level=["all"],
    )  # 3 routes
    out = tmp_path / "faults.json.gz"
    Recorder(spec, out, rounds=2).run(log=lambda s: None)
    land = load_landscape(out)
    statuses = sorted(tuple(r.status for r in p.rounds) for p in land.points)
    # build 0 crashed (re-run in round 2, where it built), build 1 failed to build (not re-run)
    assert statuses == sorted([(J.CRASH_SIGNAL, J.OK), (J.BUILD_ERROR,), (J.OK, J.OK)])
    crashed = next(p for p in land.points if p.rounds[0].status == J.CRASH_SIGNAL)
    assert "SIGSEGV" in crashed.rounds[0].message and crashed.rounds[0].phase == "build"


def test_a_random_subset_is_recorded_and_stated(tmp_path: Path) -> None:
    spec = write_tiny_study(tmp_path)
    land = Recorder(spec, tmp_path / "sub.json.gz", rounds=1, sample=2, seed=3).run(log=lambda s: None)
    assert (
        len(land.points) in (2, 3) and land.default_point() is not None
    )  # the default route joins: every route pairs with it
    assert all(
        r.speedup for p in land.points if p is not land.default_point() for r in p.rounds
    )  # timed paired with it
    assert all(r.loadavg for p in land.points for r in p.rounds)  # the load average of every measurement
    assert land.meta["enumeration"]["subset_seed"] == 3 and land.meta["enumeration"]["space_routes"] == 6


def test_replay_space_reproduces_the_recorded_conditions(recorded) -> None:
    spec_path, path = recorded
    original = Context(load_spec(spec_path), "").space
    space = replay_space(load_landscape(path))
    assert space.default_route() == original.default_route()
    assert sorted(map(route_hash, space.routes())) == sorted(map(route_hash, original.routes()))
    assert space.check({"provider": "cpu", "precision": "bf16"}) == "route not in the landscape"


# -- the benchmark on the recorded landscape ------------------------------------------------------


def test_truth_of_the_recorded_landscape(recorded) -> None:
    land = load_landscape(recorded[1])
    strict, loose = Truth(land, tolerance=1e-5), Truth(land, tolerance=1.0)
    assert len(loose.truth) == 6 and len(strict.truth) == 2  # only the fp32 routes match (to rounding)
    assert strict.best == min(strict.truth.values())
    base = land.default_point()
    base_ms = float(np.median([np.median(r.samples_ms) for r in base.rounds]))  # the default: its rounds' medians
    assert loose.truth[base.key] == pytest.approx(base_ms)
    for p in land.points:  # rounds paired with the default: its true latency over each round's speedup
        if p is not base:
            assert loose.truth[p.key] == pytest.approx(float(np.median([base_ms / r.speedup for r in p.rounds])))


@pytest.mark.parametrize("name", [n for n in STRATEGIES if n not in ("gp-fair", "smac")])
def test_every_strategy_spends_builds_on_distinct_routes_and_is_scored(recorded, name: str) -> None:
    truth = Truth(load_landscape(recorded[1]), tolerance=1.0)
    run = STRATEGIES[name].run(truth, budget=6, seed=1, drift_share=0.1)
    built = [s for s in run.steps if s.build]
    assert 1 <= len(built) <= 6
    if name != "random":  # the others never repeat a route (a repeat of a route stopped as slow is built again)
        assert len({s.key for s in built}) == len(built)
    result = score(run, truth, budget=6)
    assert result["builds"] == len(built) and len(result["curve"]) == len(built)
    valued = {
        s.key for s in run.steps if s.feasible and s.value is not None
    }  # a trial stopped as `slow` leaves no value
    if valued:  # tolerance 1.0: every recorded route is feasible; the curve is rounded to 5 places
        assert result["curve"][-1] == pytest.approx(min(truth.truth[k] for k in valued) / truth.best, abs=1e-5)


def test_scores_of_a_known_sequence(recorded) -> None:
    truth = Truth(load_landscape(recorded[1]), tolerance=1.0)
    by_value = sorted(truth.truth, key=truth.truth.__getitem__)
    best, worst_key = by_value[0], by_value[-1]
    steps = [
        Step("x", True, J.BUILD_ERROR, None, False),
        Step(worst_key, True, J.OK, truth.truth[worst_key], True),
        Step(worst_key, False, J.OK, truth.truth[worst_key], True),
        Step(best, True, J.OK, truth.truth[best], True),
    ]
    curve = built_curve(steps, truth)
    assert curve[0] == math.inf and curve[2] == pytest.approx(1.0)
    s = score(Run(steps, {}), truth, budget=20)
    assert s["builds_to_2pct"] == 3 and s["wasted_fraction"] == pytest.approx(1 / 3)
    assert (
        s["regret_at_20"] == pytest.approx(0.0) and s["delivered_regret_at_20"] == math.inf
    )  # these steps deliver nothing
    assert summarise([1, 3, None, 5, None]) == {"median": 5.0, "q25": 3.0, "q75": None, "n": 5, "reached": 3}
    assert summarise([1, 2, 3]) == {"median": 2.0, "q25": 1.5, "q75": 2.5, "n": 3, "reached": 3}


def test_the_benchmark_command_writes_json_markdown_and_png(
    recorded, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.search_efficiency as se

    tiny = se.Scenario("tiny", str(recorded[1]), "tiny", 1.0)
    monkeypatch.setattr(se, "SCENARIOS", (tiny, se.Scenario("tiny-strict", str(recorded[1]), "tiny", 1e-5)))

    def bench(*extra: str, without: str = "") -> subprocess.CompletedProcess[str]:
        """The benchmark's command in this process: its exit status and output."""
        with monkeypatch.context() as scoped:
            if without:
                scoped.setitem(sys.modules, without, None)  # not installed: importing it raises ImportError
            capsys.readouterr()
            rc = se.main(
                ["--seeds", "2", "--budget", "6", "--strategies", *extra, "--json", str(tmp_path / "r.json")]
                + ["--markdown", str(tmp_path / "r.md"), "--png", str(tmp_path / "r.png")]
            )
            out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["search_efficiency", *extra], rc, out, err)

    first = bench("random", "--stop-after", "0")  # stops before any run: nothing complete, all of it missing
    assert first.returncode == 3, first.stderr
    assert json.loads((tmp_path / "r.json").read_text())["missing"] == ["tiny/random", "tiny-strict/random"]
    assert bench("random").returncode == 0  # the complete file the next call resumes from
    kept = json.loads((tmp_path / "r.json").read_text())["results"]["tiny"]["random"]
    done = bench("local", "random", "gpt-fast", "--resume")
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["results"]["tiny"]["random"] == kept  # resumed: the earlier cell is kept, not run again
    assert set(doc["results"]) == {"tiny", "tiny-strict"} and set(doc["results"]["tiny"]) == {
        "local",
        "random",
        "gpt-fast",
    }
    assert len(doc["results"]["tiny"]["local"]["runs"]) == 2
    md = (tmp_path / "r.md").read_text()
    assert "<!-- results:begin -->" in md and "| `gpt-fast` |" in md
    before = (tmp_path / "r.json").read_bytes()
    unmade = bench("random", "smac", without="ConfigSpace")  # SMAC3 missing: refused before any run, one line
    assert unmade.returncode == 2 and unmade.stderr.strip().startswith("error: --strategies smac: "), unmade.stderr
    assert len(unmade.stderr.strip().splitlines()) == 1 and (tmp_path / "r.json").read_bytes() == before
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_sampler_builds_an_untried_route_instead_of_a_repeat() -> None:
    import optuna

    from tuner.spec import RunSpec
    from tuner.study.sampler import make_sampler

    study = optuna.create_study(sampler=make_sampler(RunSpec(budget=1, sampler="tpe", startup_trials=4), 0))
    seen: list[tuple[int, str]] = []
    for i in range(12):
        t = study.ask()
        route = (t.suggest_categorical("a", [0, 1, 2]), t.suggest_categorical("b", ["x", "y", "z"]))
        if i >= 4 and len(set(seen)) < 9:  # after the random start-up trials, no repeat while any route is untried
            assert route not in seen
        seen.append(route)
        study.tell(t, route[0] + ord(route[1]) / 100)
    assert len(set(seen)) == 9


def test_shards_keep_each_precision_variant_on_one_shard(tmp_path: Path) -> None:
    """A precision variant is built once per shard that has one of its routes: shards split by variant, not by index
    (nothing is measured here)."""
    spec = write_tiny_study(tmp_path)
    every = Recorder(spec, tmp_path / "all.json.gz", rounds=1).routes
    shards = [Recorder(spec, tmp_path / f"{k}.json.gz", rounds=1, shard=(k, 2)).routes for k in range(2)]
    default = Context(load_spec(spec), "").space.default_route()
    assert all(default in routes for routes in shards)  # every shard pairs with the default route
    assert sorted(map(route_hash, every)) == sorted({route_hash(r) for routes in shards for r in routes})
    variants = [{(r["precision"], r.get("per_channel")) for r in routes if r != default} for routes in shards]
    assert variants[0] and variants[1] and not variants[0] & variants[1]  # 3 variants (fp32, int8 per channel or not)
