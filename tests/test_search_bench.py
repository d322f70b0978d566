"""The search benchmark's measurement model, delivered-route scoring, baselines and default choice, on a
synthetic landscape built in memory (fast and deterministic; the recorded-landscape path is in test_landscape.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import optuna
import pytest

from bench.landscape.oracle import Oracle
from bench.landscape.paired import CAP, PRECISION, SLOW, Candidate, Paired, PairedMeter, PairedPolicy, Race
from bench.landscape.score import score, share
from bench.landscape.strategies import STRATEGIES, Evaluator, Olive, Step, condition_parents, gpt_fast, gpt_mixed
from bench.search_efficiency import choose_default
from tuner.backends.replay.landscape import Landscape, Point, Round
from tuner.space import route_hash
from tuner.spec import RunSpec
from tuner.study.sampler import sampler_for
from tuner import job as J

# a: 0 (default) | 1 | 2; b: x (default) | y; c: only when a == 2
TRUE_MS = {(0, "x", None): 40.0, (0, "y", None): 30.0, (1, "x", None): 20.0, (1, "y", None): 12.0,
           (2, "x", 0): 10.0, (2, "x", 1): 25.0, (2, "y", 0): 11.0, (2, "y", 1): 35.0}
INACCURATE = {(1, "y", None), (2, "x", 0)}  # fast, but their outputs break the tolerance


def _route(a: int, b: str, c: int | None) -> dict:
    return {"a": a, "b": b, **({} if c is None else {"c": c})}


def synthetic(residual: float = 0.0, drift: float = 0.0) -> Landscape:
    """Eight routes, three rounds each: per-call samples spread ±`residual` around each round's median,
    rounds at the true value × (1 - drift, 1, 1 + drift)."""
    ref = [{"y": np.zeros(4, dtype=np.float32)} for _ in range(2)]
    points, outputs = [], {"exact": ref, "off": [{"y": np.full(4, 0.5, dtype=np.float32)} for _ in range(2)]}
    for (a, b, c), ms in TRUE_MS.items():
        rounds = tuple(Round(J.OK, "accuracy", samples_ms=tuple(level * (1 + residual * k) for k in (-1, -0.5, 0, 0.5, 1)))
                       for level in (ms * (1 - drift), ms, ms * (1 + drift)))
        points.append(Point(_route(a, b, c), rounds, outputs="off" if (a, b, c) in INACCURATE else "exact"))
    meta = {"accuracy": {"metric": "max_abs", "tolerance": 0.1, "atol": 0.0, "rtol": 0.0}, "data": {"gate_samples": 1},
            "objective": {"statistic": "median"},
            "space": [{"name": "a", "choices": [0, 1, 2], "default": 0}, {"name": "b", "choices": ["x", "y"], "default": "x"},
                      {"name": "c", "choices": [0, 1], "default": 0}]}
    return Landscape(meta, points, ["f0", "f1"], ref, outputs)


def key(a: int, b: str, c: int | None = None) -> str:
    return route_hash(_route(a, b, c))


BASE = key(0, "x")


def meter(landscape: Landscape, **policy) -> PairedMeter:
    return PairedMeter(Oracle(landscape, 0.1), PairedPolicy(**policy), np.random.default_rng(0))


# -- paired measurement ---------------------------------------------------------------------------


def test_noiseless_pairing_measures_the_true_ratio_and_stops_on_precision() -> None:
    m = meter(synthetic(), min_duration_s=0.0).measure(key(1, "x"), BASE)
    assert m.log_ratio == pytest.approx(math.log(20 / 40)) and m.half_width == pytest.approx(0.0, abs=1e-6)
    assert m.stopped == PRECISION and m.cycles == 6


def test_within_round_noise_is_averaged_down_and_drift_leaks_only_by_its_share() -> None:
    land = synthetic(residual=0.4, drift=0.5)
    m = meter(land, leak=0.0)
    ideal = [m.measure(key(1, "x"), BASE).log_ratio for _ in range(40)]
    leaky = meter(land, leak=1.0)
    unpaired = [leaky.measure(key(1, "x"), BASE).log_ratio for _ in range(40)]
    assert abs(np.mean(ideal) - math.log(0.5)) < 0.02 and np.std(ideal) < 0.06
    assert np.std(unpaired) > 3 * np.std(ideal)  # the recorded round-to-round drift comes back with leak 1


def test_the_timing_cap_and_early_pruning_stop_a_measurement() -> None:
    land = synthetic(residual=0.4)
    capped = meter(land, cap_s=3.0, half_width=0.0001).measure(key(1, "x"), BASE)
    cycle_s = 2 * (3 * 20.0 + 2 * 40.0) / 1000  # 50 ms blocks: 3 calls of 20 ms, 2 of 40 ms
    assert capped.stopped == CAP and 3.0 <= capped.seconds < 3.0 + cycle_s
    slow = meter(land).measure(key(0, "y"), BASE, slow_above=math.log(0.5))  # 30 ms against an incumbent at 20 ms
    assert slow.stopped == SLOW and slow.cycles == 6


def test_pooling_measurements_widens_the_interval_by_their_disagreement() -> None:
    agree = Candidate("k", [_paired(0.1, 0.02), _paired(0.1, 0.02)]).pooled()
    assert agree[0] == pytest.approx(0.1) and agree[1] < 0.02  # two agreeing measurements: narrower than either
    est, hw = Candidate("k", [_paired(0.1, 0.02), _paired(0.3, 0.02)]).pooled()
    assert est == pytest.approx(0.2) and est - hw < 0.1 and est + hw > 0.3  # they disagree: the interval spans both


def _paired(log_ratio: float, hw: float) -> Paired:
    return Paired(log_ratio, hw, 6, PRECISION, 1.0)


def test_racing_remeasures_the_new_leader_and_overlapping_rivals_and_delivers_only_confirmed_routes() -> None:
    race = Race(meter(synthetic(), min_duration_s=0.0), BASE)
    race.add(key(1, "x"), _paired(math.log(0.5), 0.01))
    assert race.to_race() == [key(1, "x")] and race.delivered == BASE  # never re-measured: not confirmed yet
    race.race()
    assert race.delivered == key(1, "x") and race.to_race() == []
    race.add(key(2, "y", 0), _paired(math.log(0.5) + 0.005, 0.01))  # overlaps the leader: both raced
    assert set(race.to_race()) == {key(1, "x"), key(2, "y", 0)}
    race.race()  # its noiseless re-measurement (11 ms) puts it ahead, but disagrees with its first (20 ms) ...
    assert race.delivered == key(2, "y", 0) and race.to_race() == [key(2, "y", 0)]  # ... so its pool overlaps: once more
    race.race()
    assert race.to_race() == [] and race.remeasures == 4
    assert race.delivered == key(2, "y", 0)
    assert len(race.candidates[key(1, "x")].measurements) == 3  # the trial's and two re-measurements: no more


def test_a_route_slower_than_the_default_is_never_delivered() -> None:
    race = Race(meter(synthetic(), min_duration_s=0.0), BASE)
    race.add(key(2, "x", 1), _paired(math.log(25 / 40) + 0.6, 0.01))  # measured far slower than the default
    race.race()
    assert race.delivered == BASE


# -- delivered-route scoring ------------------------------------------------------------------------


def test_delivered_regret_counts_what_the_rule_delivers_not_what_was_built() -> None:
    oracle = Oracle(synthetic(), 0.1)
    best = key(2, "y", 0)  # 11 ms: the true best feasible
    steps = [Step(BASE, True, J.OK, 40.0, True, BASE), Step(best, True, J.OK, 11.0, True, BASE),
             Step(key(1, "x"), True, J.OK, 20.0, True, key(1, "x")), Step(key(0, "y"), True, J.OK, 30.0, True, best)]
    s = score(steps, oracle, budget=10)
    assert oracle.best == 11.0
    assert s["builds_to_2pct"] == 2 and s["delivered_builds_to_2pct"] == 4  # built at 2, delivered from 4 on
    assert s["delivered_regret_at_10"] == pytest.approx(0.0) and s["delivered_within_2pct_at_10"]
    assert s["delivered_curve"] == pytest.approx([40 / 11, 40 / 11, 20 / 11, 1.0], rel=1e-4)
    flaky = score(steps[:3] + [Step(key(1, "y"), True, J.OK, 12.0, True, key(1, "y"))], oracle, budget=10)
    assert flaky["delivered_regret_at_10"] == math.inf  # an inaccurate route delivered is no delivery
    assert share([True, False, True, True]) == {"share": 0.75, "n": 4}


def test_ours_delivers_after_pairing_and_racing_and_gpt_delivers_its_fastest_accurate_iteration() -> None:
    oracle = Oracle(synthetic(residual=0.2, drift=0.3), 0.1)
    ours = STRATEGIES["ours"].evaluate(oracle, budget=8, seed=3)
    assert ours.race is not None and ours.steps[0].key == BASE
    assert all(s.delivered == ours.race.delivered for s in ours.steps[-1:])
    assert ours.steps[-1].delivered == key(2, "y", 0)  # all 8 routes built: it delivers the true best
    gpt = STRATEGIES["gpt-fast"].evaluate(oracle, budget=8, seed=3)
    feasible = [s for s in gpt.steps if s.feasible]
    assert gpt.steps[-1].delivered == min(feasible, key=lambda s: s.value).key


def test_gpt_mixed_counts_a_faster_inaccurate_knob_as_positive_like_trtexec() -> None:
    oracle = Oracle(synthetic(), 0.1)
    ev = Evaluator(oracle, np.random.default_rng(0), budget=100, gate=False)
    # one-offs from (0, x): a=1 (20 ms), a=2 (10 ms, inaccurate), b=y (30 ms): all faster than 40 ms
    assert gpt_fast(oracle, ev) == {"a", "b"}
    ev = Evaluator(oracle, np.random.default_rng(0), budget=100, gate=False)
    gpt_mixed(oracle, ev)
    assert ev.builds == len(TRUE_MS)  # phase 2 sweeps every combination of a and b (and c under a=2)


# -- Olive ----------------------------------------------------------------------------------------------


def test_olive_names_a_conditional_knob_after_its_parents_and_tells_latency_and_accuracy() -> None:
    oracle = Oracle(synthetic(), 0.1)
    assert condition_parents(oracle.space) == {"a": (), "b": (), "c": ("a",)}
    study = optuna.create_study(directions=["minimize", "minimize"])
    trial = study.ask({"a": optuna.distributions.CategoricalDistribution([0, 1, 2])})
    route = Olive().suggest(trial, oracle.space)
    assert set(trial.params) == {"a", "b", f"c___{route['a']}"}  # inactive or not, c is sampled under its parent's value
    Olive().tell(study, trial, oracle.evaluate(route, np.random.default_rng(0), gate=False), Evaluator(oracle, np.random.default_rng(0), 1))
    assert len(study.trials[0].values) == 2


def test_olive_reasks_duplicate_index_vectors_and_delivers_its_best_candidate() -> None:
    oracle = Oracle(synthetic(), 0.1)
    ev = STRATEGIES["olive"].evaluate(oracle, budget=8, seed=0)
    assert ev.builds <= 8 and len({s.key for s in ev.steps if s.build}) == ev.builds
    accepted = [s for s in ev.steps if s.feasible]
    assert ev.steps[-1].delivered == min(accepted, key=lambda s: s.value).key


# -- choosing the default ---------------------------------------------------------------------------------


def _doc(shares: dict[str, list[float]]) -> dict:
    scenarios = {"s1": {"held_out": False}, "s2": {"held_out": False}, "h": {"held_out": True}}
    results = {sc: {strat: {"delivered_within_2pct_at_30": {"share": v[i], "n": 20}} for strat, v in shares.items()}
               for i, sc in enumerate(scenarios)}
    return {"scenarios": scenarios, "results": results, "strategies": {s: "" for s in shares}}


def test_the_default_changes_only_for_a_clear_win_on_the_tuning_scenarios() -> None:
    close = choose_default(_doc({"ours": [0.8, 0.9, 0.0], "random": [0.85, 0.95, 1.0]}))
    assert close["chosen"] == "ours" and close["tuning_scenarios"] == ["s1", "s2"] and close["held_out"] == ["h"]
    clear = choose_default(_doc({"ours": [0.6, 0.9, 1.0], "random": [0.75, 0.95, 0.0]}))
    assert clear["chosen"] == "random"  # lowest share 0.75 vs 0.60: held-out results play no part
    assert clear["held_out_result"]["h"]["delivered_within_2pct_at_30"]["share"] == 0.0


def test_sampler_for_repeats_a_run_with_the_same_seed() -> None:
    def proposals(seed: int) -> list[int]:
        study = optuna.create_study(sampler=sampler_for(RunSpec(budget=1, startup_trials=2), seed))
        out = []
        for _ in range(6):
            t = study.ask()
            out.append(t.suggest_categorical("x", list(range(20))))
            study.tell(t, float(out[-1]))
        return out

    assert proposals(5) == proposals(5) and proposals(5) != proposals(6)


def test_every_paired_strategy_measures_the_default_first() -> None:
    oracle = Oracle(synthetic(residual=0.1), 0.1)
    ev = Evaluator(oracle, np.random.default_rng(0), budget=3, policy=replace(PairedPolicy(), leak=0.0))
    with pytest.raises(ValueError, match="default route measured first"):
        ev(_route(1, "x", None))


def test_a_slow_trial_is_told_like_the_worker_tells_it() -> None:
    oracle = Oracle(synthetic(residual=0.2), 0.1)
    ev = STRATEGIES["ours"].evaluate(oracle, budget=8, seed=1)
    slow = [s for s in ev.steps if s.pruned]
    assert slow and all(s.status == J.SLOW and not s.feasible and s.value is None for s in slow)
    assert all(s.value == pytest.approx(ev.base_value * TRUE_MS_BY_KEY[s.key] / 40.0, rel=0.5) for s in ev.steps if s.feasible and s.key != BASE)


TRUE_MS_BY_KEY = {key(a, b, c): ms for (a, b, c), ms in TRUE_MS.items()}


def test_the_default_study_sampler_is_tpe_with_four_start_up_trials(tmp_path) -> None:
    from tests.conftest import to_toml
    from tests.models import conv_model
    from tuner.spec import load_spec

    spec = tmp_path / "s.toml"
    spec.write_text(to_toml({"study": {"name": "s"}, "model": {"path": str(conv_model(tmp_path / "m.onnx"))},
                             "accuracy": {"metric": "max_abs", "tolerance": 1.0}, "backend": {"name": "onnxruntime"}, "run": {"budget": 2}}))
    run = load_spec(spec).run
    assert run.startup_trials == 4 == RunSpec(budget=1).startup_trials
    tpe = sampler_for(run, 0).base
    assert isinstance(tpe, optuna.samplers.TPESampler) and tpe._n_startup_trials == 4
