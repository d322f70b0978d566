"""The search benchmark: the simulation runner drives the tuner's own study code on a landscape, scoring, baselines and
the default choice, on a synthetic landscape built in memory (the recorded-landscape path is in test_landscape.py)."""

from __future__ import annotations

import ast
import json
import math
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest

from bench.landscape.score import score, share
from bench.landscape.simulate import Simulation, Step, simulate
from bench.landscape.strategies import STRATEGIES, Direct, Run, condition_parents, gpt_fast, gpt_mixed
from bench.landscape.truth import Truth
from bench.search_efficiency import (
    SCENARIOS,
    available,
    choose_default,
    dates,
    earlier_results,
    resumed_strategies,
    truth_for,
)
from tests.conftest import REPO
from tuner import job as J
from tuner.backends.replay.landscape import Landscape, Point, Round
from tuner.space import route_hash
from tuner.spec import RunSpec
from tuner.study.sampler import sampler_for
from tuner.worker import confirm as C

# a: 0 (default) | 1 | 2; b: x (default) | y; c: only when a == 2
TRUE_MS = {
    (0, "x", None): 40.0,
    (0, "y", None): 30.0,
    (1, "x", None): 20.0,
    (1, "y", None): 12.0,
    (2, "x", 0): 10.0,
    (2, "x", 1): 25.0,
    (2, "y", 0): 11.0,
    (2, "y", 1): 35.0,
}
INACCURATE = {(1, "y", None), (2, "x", 0)}  # fast, but their outputs break the tolerance


def _route(a: int, b: str, c: int | None) -> dict:
    return {"a": a, "b": b, **({} if c is None else {"c": c})}


def synthetic(residual: float = 0.0, drift: float = 0.0, crash: tuple | None = None) -> Landscape:
    """Eight routes, three rounds each: per-call samples spread ±`residual` around each round's level,
    rounds at the true value × (1 - drift, 1, 1 + drift); `crash`: a route whose child died in every round."""
    ref = [{"y": np.zeros(4, dtype=np.float32)} for _ in range(2)]
    points, outputs = [], {"exact": ref, "off": [{"y": np.full(4, 0.5, dtype=np.float32)} for _ in range(2)]}
    for (a, b, c), ms in TRUE_MS.items():
        rounds = tuple(
            Round(J.OK, "accuracy", samples_ms=tuple(level * (1 + residual * k) for k in (-1, -0.5, 0, 0.5, 1) * 4))
            for level in (ms * (1 - drift), ms, ms * (1 + drift))
        )
        if (a, b, c) == crash:
            rounds = (Round(J.CRASH_SIGNAL, "build", "child died of SIGSEGV during build"),)
        points.append(Point(_route(a, b, c), rounds, outputs="off" if (a, b, c) in INACCURATE else "exact"))
    meta = {
        "accuracy": {"metric": "max_abs", "tolerance": 0.1, "atol": 0.0, "rtol": 0.0},
        "data": {"gate_samples": 1},
        "objective": {"statistic": "median"},
        "backend": {"name": "synthetic", "options": {}},
        "space": [
            {"name": "a", "choices": [0, 1, 2], "default": 0},
            {"name": "b", "choices": ["x", "y"], "default": "x"},
            {"name": "c", "choices": [0, 1], "default": 0},
        ],
    }
    return Landscape(meta, points, ["f0", "f1"], ref, outputs)


def key(a: int, b: str, c: int | None = None) -> str:
    return route_hash(_route(a, b, c))


BASE = key(0, "x")
BEST = key(2, "y", 0)  # 11 ms: the true best feasible route


def tpe(truth: Truth, seed: int = 0) -> optuna.samplers.BaseSampler:
    return sampler_for(RunSpec(budget=1, sampler="tpe"), seed, truth.space)


# -- the simulation runner ------------------------------------------------------------------------------


def test_a_simulated_study_runs_the_default_first_records_like_the_worker_and_delivers_the_true_best(
    tmp_path: Path,
) -> None:
    truth = Truth(synthetic(residual=0.05), 0.1)
    sim = Simulation(truth, tpe(truth), tmp_path)
    sim.run(budget=8, checkpoints=(8,))
    trials = sim.study.get_trials()
    assert trials[0].user_attrs["source"] == "baseline" and sim.steps[0].key == BASE
    assert sim.builds == 8 and len({s.key for s in sim.steps if s.build}) == 8  # every route once, none rebuilt
    assert all({"accuracy", "failure"} <= set(t.constraints) for t in trials)  # tuner.study.outcome.record wrote them
    paired = [t for t in trials if t.user_attrs.get("paired")]
    assert paired and all(
        t.user_attrs["timing"]["cycles"] >= 6 for t in paired
    )  # the real paired measurement's minimum
    assert sim.remeasures >= 1 and sim.study.user_attrs["racing"]  # racing re-measured the leaders
    assert sim.confirmed[8] == BEST and sim.steps[-1].delivered == BEST
    assert sim.seconds > 0  # the virtual clock advanced by the replayed calls
    judged = len(C.pick_candidates(trials, trials[0], 3))  # every one measured at least MIN_ROUNDS times
    assert C.MIN_ROUNDS * judged <= sim.confirm_runs[8] <= C.EXTEND * C.DEFAULT_ROUNDS * judged


def test_a_recorded_crash_is_told_as_the_worker_tells_a_dead_child(tmp_path: Path) -> None:
    truth = Truth(synthetic(crash=(1, "x", None)), 0.1)
    sim = Simulation(truth, tpe(truth), tmp_path)
    sim.run(budget=8)
    crashed = next(t for t in sim.study.get_trials() if t.params == {"a": 1, "b": "x"})
    assert crashed.state == optuna.trial.TrialState.PRUNED and crashed.user_attrs["failure_class"] == J.CRASH_SIGNAL
    assert "SIGSEGV" in crashed.user_attrs["message"]  # this process is alive: the death was raised, not re-enacted


def test_runs_repeat_for_a_seed_and_differ_across_seeds() -> None:
    truth = Truth(synthetic(residual=0.2, drift=0.2), 0.1)

    def values(seed: int) -> list:
        return [s.value for s in simulate(truth, tpe(truth, seed), 6, drift_share=1.0, seed=seed).steps]

    assert values(3) == values(3) and values(3) != values(4)


TUNER_CODE = {  # what the benchmark must run rather than copy: module -> functions
    "tuner.measure.paired": ("measure_paired",),
    "tuner.worker.child": ("run_trial",),
    "tuner.worker.timing": ("time_trial",),
    "tuner.study.racing": ("standings", "to_race", "incumbent", "after_remeasure", "best_confirmed"),
    "tuner.study.outcome": ("record",),
    "tuner.worker.confirm": ("judge_study",),
    "tuner.study.verdict": ("decide",),
    "tuner.measure.speedup": ("pooled_speedup",),
}


def test_the_benchmark_calls_the_tuners_measurement_racing_child_and_verdict(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every module that holds one of these functions gets a counting wrapper of the same function; a tiny run calls
    each."""
    import importlib

    calls: dict[str, int] = {}
    for module, names in TUNER_CODE.items():
        for name in names:
            original = getattr(importlib.import_module(module), name)
            label = f"{module}.{name}"
            calls[label] = 0

            def counted(*args, __f=original, __label=label, **kw):
                calls[__label] += 1
                return __f(*args, **kw)

            for mod in [
                m for n, m in list(sys.modules.items()) if m and (n.startswith("tuner") or n.startswith("bench"))
            ]:
                if getattr(mod, name, None) is original:
                    monkeypatch.setattr(mod, name, counted)
    truth = Truth(synthetic(residual=0.05), 0.1)
    Simulation(truth, tpe(truth), tmp_path).run(budget=6, checkpoints=(6,))
    assert all(calls.values()), {k: v for k, v in calls.items() if not v}


def test_the_benchmark_defines_no_measurement_racing_or_child_of_its_own() -> None:
    """No module of bench/landscape defines a function or class named like the tuner's, nor imports the statistics
    racing pools with."""
    import importlib

    tuner_names = {
        n
        for module in TUNER_CODE
        for n, v in vars(importlib.import_module(module)).items()
        if callable(v) and getattr(v, "__module__", None) == module and not n.startswith("_") and n != "main"
    }
    for path in sorted((REPO / "bench" / "landscape").glob("*.py")):
        tree = ast.parse(path.read_text())
        defined = {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.ClassDef) and not n.name.startswith("_")
        }
        assert not defined & tuner_names, f"{path.name} defines {sorted(defined & tuner_names)}"
        imported = {
            a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "tuner.measure.speedup"
            for a in n.names
        }
        assert not imported, f"{path.name} pools measurements itself ({imported})"


# -- scoring -----------------------------------------------------------------------------------------------


def test_delivered_regret_counts_what_the_study_delivers_not_what_was_built() -> None:
    truth = Truth(synthetic(), 0.1)
    steps = [
        Step(BASE, True, J.OK, 40.0, True, BASE),
        Step(BEST, True, J.OK, 11.0, True, BASE),
        Step(key(1, "x"), True, J.OK, 20.0, True, key(1, "x")),
        Step(key(0, "y"), True, J.OK, 30.0, True, BEST),
    ]
    s = score(Run(steps, {}), truth, budget=10)
    assert truth.best == pytest.approx(11.0)
    assert s["builds_to_2pct"] == 2 and s["delivered_builds_to_2pct"] == 4  # built at 2, delivered from 4 on
    assert s["delivered_regret_at_10"] == pytest.approx(0.0) and s["delivered_within_2pct_at_10"]
    assert s["delivered_curve"] == pytest.approx([40 / 11, 40 / 11, 20 / 11, 1.0], rel=1e-4)
    confirmed = score(
        Run(steps, {4: key(1, "x")}), truth, budget=10
    )  # the final confirmation delivered the 20 ms route
    assert (
        confirmed["delivered_regret_at_10"] == pytest.approx(20 / 11 - 1)
        and not confirmed["delivered_within_2pct_at_10"]
    )
    flaky = score(Run(steps, {4: key(1, "y")}), truth, budget=10)
    assert flaky["delivered_regret_at_10"] == math.inf  # an inaccurate route delivered is no delivery
    assert share([True, False, True, True]) == {"share": 0.75, "n": 4}


# -- GPT and Olive -------------------------------------------------------------------------------------------


def _direct(tmp_path: Path, residual: float = 0.0) -> Direct:
    truth = Truth(synthetic(residual=residual), 0.1)
    return Direct(Simulation(truth, optuna.samplers.RandomSampler(0), tmp_path, recommended=False), budget=100)


def test_gpt_mixed_counts_a_faster_inaccurate_knob_as_positive_like_trtexec(tmp_path: Path) -> None:
    # one-offs from (0, x): a=1 (20 ms), a=2 (10 ms, inaccurate), b=y (30 ms): all faster than 40 ms
    assert gpt_fast(_direct(tmp_path / "fast")) == {"a", "b"}
    ev = _direct(tmp_path / "mixed")
    gpt_mixed(ev)
    assert ev.sim.builds == len(TRUE_MS)  # phase 2 sweeps every combination of a and b (and c under a=2)
    assert ev.steps[-1].delivered == BEST  # its fastest accurate measurement


def test_olive_names_a_conditional_knob_after_its_parents_and_delivers_its_best_candidate(tmp_path: Path) -> None:
    truth = Truth(synthetic(), 0.1)
    assert condition_parents(truth.space) == {"a": (), "b": (), "c": ("a",)}
    run = STRATEGIES["olive"].run(truth, budget=8, seed=0, drift_share=1.0)
    built = [s for s in run.steps if s.build]
    assert len(built) <= 8 and len({s.key for s in built}) == len(built)
    accepted = [s for s in run.steps if s.feasible]
    assert run.steps[-1].delivered == min(accepted, key=lambda s: s.value).key


@pytest.mark.parametrize("name", ["local", "tpe", "random", "gp-fair", "smac", "gpt-fast"])
def test_every_strategy_spends_builds_on_distinct_routes_and_is_scored(name: str) -> None:
    if name == "smac":
        pytest.importorskip("smac", reason="SMAC3 comes with the bench extra (pip install '.[bench]')")
    truth = Truth(synthetic(residual=0.05), 0.1)
    run = STRATEGIES[name].run(truth, budget=6, seed=1, drift_share=1.0)
    built = [s for s in run.steps if s.build]
    assert 1 <= len(built) <= 6 and len({s.key for s in built}) == len(built)
    result = score(run, truth, budget=6)
    assert result["builds"] == len(built) and len(result["curve"]) == len(built)


# -- choosing the default ---------------------------------------------------------------------------------


def _doc(shares: dict[str, list[float]], seeds: int = 20) -> dict:
    scenarios = {"s1": {"held_out": False}, "s2": {"held_out": False}, "h": {"held_out": True}}
    results = {
        sc: {strat: {"delivered_within_2pct_at_30": {"share": v[i], "n": seeds}} for strat, v in shares.items()}
        for i, sc in enumerate(scenarios)
    }
    return {"scenarios": scenarios, "results": results, "strategies": {s: "" for s in shares}}


def test_the_default_changes_only_for_a_clear_win_on_the_tuning_scenarios() -> None:
    close = choose_default(_doc({"tpe": [0.8, 0.9, 0.0], "random": [0.85, 0.95, 1.0]}), current="tpe")
    assert close["chosen"] == "tpe" and close["tuning_scenarios"] == ["s1", "s2"] and close["held_out"] == ["h"]
    clear = choose_default(_doc({"tpe": [0.6, 0.9, 1.0], "random": [0.75, 0.95, 0.0]}), current="tpe")
    assert clear["chosen"] == "random"  # lowest share 0.75 vs 0.60: held-out results play no part
    assert clear["held_out_result"]["h"]["delivered_within_2pct_at_30"]["share"] == 0.0
    two_of_twenty = choose_default(_doc({"tpe": [0.6, 0.9, 1.0], "random": [0.7, 0.95, 0.0]}), current="tpe")
    assert two_of_twenty["chosen"] == "random"  # a lead of exactly the margin (2 seeds of 20) counts
    one_of_ten = choose_default(_doc({"tpe": [0.4, 1.0, 1.0], "random": [0.5, 0.6, 0.0]}, seeds=10), current="tpe")
    assert one_of_ten["chosen"] == "tpe"  # one seed of ten is within the noise: the default stays


def test_sampler_for_repeats_a_run_with_the_same_seed() -> None:
    def proposals(seed: int) -> list[int]:
        study = optuna.create_study(sampler=sampler_for(RunSpec(budget=1, sampler="tpe", startup_trials=2), seed))
        out = []
        for _ in range(6):
            t = study.ask()
            out.append(t.suggest_categorical("x", list(range(20))))
            study.tell(t, float(out[-1]))
        return out

    assert proposals(5) == proposals(5) and proposals(5) != proposals(6)


def test_resume_without_strategies_goes_on_with_the_results_file_s_own(tmp_path) -> None:
    """A resumed run without --strategies runs the strategies the file holds, not every strategy the benchmark has."""
    results = tmp_path / "search-efficiency.json"
    results.write_text('{"strategies": {"local": "l", "tpe": "t", "gone": "a strategy no longer defined"}}')
    assert resumed_strategies(results) == ["local", "tpe"]
    results.write_text("not json")
    assert resumed_strategies(results) is None
    assert resumed_strategies(tmp_path / "missing.json") is None


def test_resumed_results_are_dated_by_their_first_piece(tmp_path: Path) -> None:
    """A resumed file keeps the first piece's start as its date and names the last resumption beside it."""
    scenario = available(SCENARIOS)[0]
    settings = {"seeds": 1}
    first = {"generated": "2026-12-06 10:00 UTC", "settings": settings, "results": {scenario.name: {}}}
    first["scenarios"] = {scenario.name: {"facts": truth_for(scenario).describe()}}
    path = tmp_path / "search.json"
    path.write_text(json.dumps(first))
    previous = earlier_results(path, settings, [scenario])
    assert dates("2026-12-06 12:00 UTC", previous) == {
        "generated": "2026-12-06 10:00 UTC",
        "resumed": "2026-12-06 12:00 UTC",
    }
    assert dates("2026-12-06 12:00 UTC", earlier_results(path, {"seeds": 2}, [scenario])) == {
        "generated": "2026-12-06 12:00 UTC"  # other settings: started over
    }
