"""Racing and pruning decisions, the baseline gate across real processes, and a real study whose trials carry paired
ratios."""

from __future__ import annotations

import math
import random
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from tests.conftest import SpecWriter, run_study
from tests.helpers import trials as read_trials
from tuner import job as J
from tuner.store.cache import ResultStore
from tuner.store.urls import normalize_url
from tuner.study import racing as R
from tuner.study.outcome import judge


def _trial(
    number: int, speedup: float, ci: tuple[float, float], feasible: bool = True, source: str = ""
) -> optuna.trial.FrozenTrial:
    attrs = {"paired": True, "speedup_paired": speedup, "speedup_paired_ci": list(ci)}
    if source:
        attrs = {"source": source, "paired": False, "speedup_paired": 1.0, "speedup_paired_ci": [1.0, 1.0]}
    t = optuna.trial.create_trial(
        params={"k": str(number)},
        distributions={"k": CategoricalDistribution([str(i) for i in range(20)])},
        value=10.0 / speedup,
        user_attrs=attrs,
        constraints={"accuracy": -1.0 if feasible else 0.5, "failure": -1.0},
    )
    t.number = number
    return t


def test_the_leader_is_re_measured_and_so_are_the_leaders_it_overlaps() -> None:
    trials = [
        _trial(0, 1.0, (1.0, 1.0), source="baseline"),
        _trial(1, 1.50, (1.45, 1.55)),
        _trial(2, 1.40, (1.30, 1.46)),
        _trial(3, 1.20, (1.15, 1.25)),
        _trial(4, 2.0, (1.9, 2.1), feasible=False),
    ]
    ranked = R.standings(trials, {})
    assert [s.number for s in ranked] == [1, 2, 3]  # the infeasible and the baseline trial do not race
    assert R.to_race(ranked) == [1, 2]  # trial 2's interval reaches into the leader's; trial 3's does not
    raced = {
        "1": {"speedup_refined": 1.52, "speedup_refined_ci": [1.50, 1.54], "remeasured": 1},
        "2": {"speedup_refined": 1.38, "speedup_refined_ci": [1.33, 1.42], "remeasured": 1},
    }
    assert R.to_race(R.standings(trials, raced)) == []  # now apart, and the leader has been re-measured
    assert R.to_race([R.Standing(1, 1.5, 1.4, 1.6, 2), R.Standing(2, 1.45, 1.35, 1.55, 2)]) == []  # re-measured enough
    assert R.to_race([R.Standing(1, 1.5, 1.4, 1.6, 0)]) == [1]  # a lone leader is re-measured once (the winner's curse)


def test_confirmed_best_and_incumbent() -> None:
    trials = [
        _trial(0, 1.0, (1.0, 1.0), source="baseline"),
        _trial(1, 1.6, (1.2, 2.0)),
        _trial(2, 1.3, (1.25, 1.35)),
        _trial(3, 1.05, (0.95, 1.1)),
    ]
    assert R.best_confirmed(trials, {}) is None  # nothing re-measured yet
    assert R.incumbent(trials, {}) == 1.25  # the best lower bound: a candidate entirely below it is slow
    raced = {
        "1": {"speedup_refined": 1.1, "speedup_refined_ci": [0.98, 1.2], "remeasured": 2},
        "2": {"speedup_refined": 1.31, "speedup_refined_ci": [1.27, 1.35], "remeasured": 1},
    }
    best = R.best_confirmed(trials, raced)
    assert best is not None and best.number == 2  # trial 1's pooled interval now includes 1.0
    assert R.incumbent([_trial(3, 0.9, (0.8, 0.95))], {}) == 1.0  # never below the default route
    attrs = R.refined_attrs(R.refine([[math.log(1.3)] * 6, [math.log(1.32)] * 6], 0.95), 1, 10.0)
    assert attrs["confirmed"] and attrs["value_refined"] == pytest.approx(10.0 / attrs["speedup_refined"])
    assert "shapes_refined" not in attrs  # one shape: nothing per shape


def test_a_re_measurement_of_several_shapes_pools_each_shape_as_it_pools_the_mixed_cycles() -> None:
    rng = random.Random(3)

    def cycles(speedup: float) -> list[float]:
        return [math.log(speedup) + rng.gauss(0, 0.01) for _ in range(12)]

    def entry(batch: int, weight: float, speedup: float) -> dict[str, object]:
        return {"inputs": {"x": [batch, 3]}, "weight": weight, "route_ms": 1.0, "log_ratios": cycles(speedup)}

    paired = [  # the trial's own measurement and one re-measurement (`measurement_stats`); a shapeless old one
        {"log_ratios": cycles(1.2), "shapes": [entry(1, 0.7, 1.3), {**entry(4, 0.3, 1.0), "default_ms": 2.0}]},
        {"log_ratios": cycles(1.2), "shapes": [entry(1, 0.7, 1.3), {**entry(4, 0.3, 1.0), "default_ms": 4.0}]},
        {"log_ratios": cycles(1.2)},
    ]
    change = R.after_remeasure(
        {"remeasured": 0}, [p["log_ratios"] for p in paired], None, 10.0, False, R.shape_pools(paired)
    )
    assert change["remeasured"] == 1 and change["speedup_refined"] == pytest.approx(1.2, rel=0.02)
    fast, flat = change["shapes_refined"]
    for i, (row, speedup, inputs) in enumerate(((fast, 1.3, [1, 3]), (flat, 1.0, [4, 3]))):
        pooled = R.refine([p["shapes"][i]["log_ratios"] for p in paired[:2]], R.CONFIDENCE)  # the same pooling
        assert row["inputs"] == {"x": inputs} and row["measurements"] == 2 and row["confidence"] == R.CONFIDENCE
        assert (row["speedup"], row["ci"]) == (pooled.estimate, [pooled.low, pooled.high])
        assert row["ci"][0] <= row["speedup"] <= row["ci"][1] and row["speedup"] == pytest.approx(speedup, rel=0.02)
    assert fast["default_ms"] is None and flat["default_ms"] == 3.0 and flat["route_ms"] == 1.0
    no_shapes = R.after_remeasure(
        {"remeasured": 0}, [p["log_ratios"] for p in paired], None, 10.0, False, R.shape_pools(paired[2:])
    )
    assert "shapes_refined" not in no_shapes and no_shapes.keys() == {*change} - {"shapes_refined"}


def test_study_value_is_the_baseline_latency_over_the_paired_speedup() -> None:
    res = J.Result(
        status=J.OK, latency={"median": 3.0}, accuracy=0.0, paired={"paired": True, "speedup": 2.0, "ci": [1.9, 2.1]}
    )
    assert judge(res, 0.1, "median", baseline_value=8.0).value == 4.0  # not the 3.0 ms measured at another moment
    assert judge(res, 0.1, "median").value == 3.0  # no baseline value yet: the measured latency
    slow = J.Result(
        status=J.SLOW, latency={"median": 9.0}, accuracy=0.0, paired={"paired": True, "speedup": 0.5, "ci": [0.4, 0.6]}
    )
    j = judge(slow, 0.1, "median", baseline_value=8.0)
    assert j.state == TrialState.PRUNED and j.constraints == (-1.0, -1.0)  # slow, not broken


def test_a_two_worker_study_pairs_every_candidate_with_the_baseline(write_spec: SpecWriter, pg_url: str) -> None:
    spec = write_spec(
        **{"run.budget": 5, "run.workers": 2, "backend.name": "tests.backends:SameEngineBackend"}
    )  # feasible routes to race
    run_study(spec, pg_url)
    trials = sorted(read_trials(pg_url, "tiny"), key=lambda t: t.number)
    base = trials[0]
    assert base.user_attrs["source"] == "baseline" and base.state == TrialState.COMPLETE
    assert base.user_attrs["speedup_paired"] == 1.0 and not base.user_attrs["paired"]
    timed = [
        t for t in trials[1:] if t.user_attrs.get("timing_stop") and not t.user_attrs.get("cache_hit")
    ]  # a hit may be trial 0's own result
    assert timed, [t.user_attrs.get("failure_class") for t in trials]
    for t in timed:
        a = t.user_attrs
        assert a["paired"], a.get("unpaired")  # the second worker waited for the baseline instead of timing alone
        low, high = a["speedup_paired_ci"]
        assert low <= a["speedup_paired"] <= high and a["timing"]["baseline_trial"] == 0
        assert a["timing_stop"] in ("precision", "cap", "slow", "ahead") and a["timing"]["exclusive"] is True
        assert len(a["timing"]["loadavg_before"]) == 3 and a["baseline_latency_ms"]["median"] > 0
        if t.state == TrialState.COMPLETE:
            assert t.value == pytest.approx(base.value / a["speedup_paired"])
        else:
            assert a["failure_class"] == "slow" and "slower than the incumbent" in a["message"]
            assert t.intermediate_values  # the running paired estimate, for the sampler
        if t.datetime_start < base.datetime_complete:  # started while the baseline was still being evaluated
            assert "baseline_wait_s" in a["timing"], a["timing"]
    study = optuna.load_study(study_name="tiny", storage=normalize_url(pg_url))
    raced = R.races(study)
    ranked = R.standings(trials, raced)
    assert ranked, "no feasible paired candidate to race"
    entry = raced[
        str(ranked[0].number)
    ]  # the leader at the end was re-measured (paired, from its stored artifact), every measurement kept
    assert entry["remeasured"] >= 1 and entry["claim"] is None
    low, high = entry["speedup_refined_ci"]
    assert low <= entry["speedup_refined"] <= high
    kept = [
        m
        for m in ResultStore(normalize_url(pg_url)).measurements("tiny", kind="race")
        if m.trial_number == ranked[0].number
    ]
    assert len(kept) == entry["remeasured"] and all(m.stats["paired"]["log_ratios"] for m in kept)


def test_a_baseline_that_does_not_load_leaves_the_candidate_timed_alone(write_spec: SpecWriter, tmp_path: Path) -> None:
    from tuner.spec import load_spec
    from tuner.study.setup import Context
    from tuner.worker.isolate import run_isolated
    from tuner.worker.jobs import make_job

    ctx = Context(load_spec(write_spec()), f"sqlite:///{tmp_path / 'x.db'}")
    broken = tmp_path / "baseline.onnx"
    broken.write_bytes(b"not an onnx model")
    route = ctx.space.default_route()
    job = make_job(
        ctx, route, tmp_path / "t" / "out", baseline={"trial": 0, "path": str(broken), "sha256": "x", "route": route}
    )
    res = run_isolated(job, tmp_path / "t")
    assert res.status == J.OK, res.message
    assert res.paired["paired"] is False and res.paired["unpaired"].startswith("the baseline engine did not load")
    assert res.latency and res.samples_ms
