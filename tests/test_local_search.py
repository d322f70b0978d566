"""The local-search sampler: knob groups, neighbourhoods, every outcome learnt from, no collisions; the warm start."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from tuner.space import Param, SearchSpace, canonical_route
from tuner.space.groups import ENUMERATE_UP_TO, NEIGHBOURS_MAX, knob_groups
from tuner.spec import RunSpec
from tuner.study import attrs as A
from tuner.study import warm_start
from tuner.study.sampler import sampler_for

SPACE = SearchSpace(
    (
        Param("precision", ("fp32", "fp16", "int8"), "fp32"),
        Param("keep", ("some", "none"), "some", when=lambda r: r["precision"] == "fp16"),
        Param("fusion", (False, True), False),
        Param("attention", (True, False), True, when=lambda r: bool(r["fusion"])),
        Param("threads", (0, 1, 2), 0),
    )
)


def latency(route: dict) -> float:
    """Fastest: fp16 with nothing kept (two one-knob moves away), fusion without attention, 1 thread."""
    ms = {"fp32": 40.0, "fp16": 30.0, "int8": 20.0}[route["precision"]]
    ms *= 0.5 if route.get("keep") == "none" else 1.0
    ms *= 0.8 if route["fusion"] and not route.get("attention", True) else 1.1 if route["fusion"] else 1.0
    return ms * (0.7 if route["threads"] == 1 else 1.0)


def test_a_knob_and_the_sub_knobs_it_activates_are_one_group() -> None:
    g = knob_groups(SPACE)
    assert g.groups == (("precision", "keep"), ("fusion", "attention"), ("threads",))
    default = SPACE.default_route()
    assert g.distance(default, SPACE.complete({"precision": "fp16", "keep": "none"})) == 1  # one move, not two
    assert (
        len(list(g.moves(default))) == 3 + 2 + 2
    )  # precision group: fp16/some, fp16/none, int8; fusion: 2; threads: 2
    assert all(g.distance(default, r) == 1 for r in g.within(default, 1))


CONDITIONAL = SearchSpace(  # above ENUMERATE_UP_TO routes: neighbourhoods are grown move by move
    (
        Param("precision", ("fp32", "fp16", "int8"), "fp32"),
        Param("keep", ("some", "none"), "some", when=lambda r: r["precision"] == "fp16"),
        *(Param(f"q{i}", (0, 1, 2, 3), 0, when=lambda r: r["precision"] == "int8") for i in range(5)),
        Param("mode", ("sequential", "parallel"), "sequential"),
        Param("inter", (0, 1, 2), 0, when=lambda r: r["mode"] == "parallel"),
        Param("threads", (0, 1, 2, 4), 0, when=lambda r: r.get("q0") != 3),
    )
)


def test_a_large_conditional_space_s_moves_are_whole_routes_one_group_away() -> None:
    g = knob_groups(CONDITIONAL)
    assert g.size > ENUMERATE_UP_TO
    int8 = CONDITIONAL.complete({"precision": "int8", "q0": 3, "mode": "parallel", "inter": 2})
    for centre in (CONDITIONAL.default_route(), int8):
        here = g.of(centre)
        ring = list(g.moves(centre))
        assert ring and all(CONDITIONAL.complete(r) == r for _, r in ring)  # whole routes, as `complete` makes them
        for moved, r in ring:  # the moved group changed; another only where the move switched its knobs on or off
            there = g.of(r)
            assert there[moved] != here[moved]
            assert all(None in (*a, *b) for j, (a, b) in enumerate(zip(here, there)) if j != moved and a != b)
        assert len({canonical_route(r) for _, r in ring}) == len(ring)
        near = g.within(centre, 2, np.random.default_rng(0))
        assert all(CONDITIONAL.contains(r) and r != centre for r in near)
        assert len({canonical_route(r) for r in near}) == len(near) > len(ring)
    assert "threads" in {k for _, r in g.moves(int8) for k in r}  # q0 = 3 switched `threads` off; a move back on


def _study(seed: int, space: SearchSpace = SPACE, storage=None, name=None) -> optuna.Study:
    study = optuna.create_study(
        sampler=sampler_for(RunSpec(budget=1, sampler="local"), seed, space), storage=storage, study_name=name
    )
    study.enqueue_trial(space.default_route(), user_attrs={"source": "baseline"})
    return study


def _tell(study: optuna.Study, trial: optuna.Trial, route: dict) -> None:
    infeasible = route["precision"] == "int8"  # fast but inaccurate: COMPLETE with a violated constraint
    trial.set_constraint("accuracy", 1.0 if infeasible else -1.0)
    trial.set_constraint("failure", -1.0)
    study.tell(trial, latency(route))


def test_the_local_search_finds_the_best_route_without_repeating_one() -> None:
    best = min(SPACE.routes(), key=lambda r: (r["precision"] == "int8", latency(r)))
    for seed in range(5):
        study = _study(seed)
        seen = []
        for _ in range(14):
            trial = study.ask()
            route = SPACE.suggest(trial)
            assert canonical_route(route) not in seen, f"seed {seed} repeated {route}"
            seen.append(canonical_route(route))
            _tell(study, trial, route)
        assert canonical_route(best) in seen, f"seed {seed}"  # 14 of the space's 24 routes


def test_parallel_proposals_do_not_collide_with_running_trials() -> None:
    study = _study(0)
    first = study.ask()
    _tell(study, first, SPACE.suggest(first))
    running = [study.ask() for _ in range(6)]
    routes = [canonical_route(SPACE.suggest(t)) for t in running]  # all six in flight at once
    assert len(set(routes)) == 6


def test_a_pruned_failure_teaches_the_surrogate_too() -> None:
    from tuner.study.local_search import observation

    study = optuna.create_study()
    t = study.ask()
    SPACE.suggest(t)
    t.set_constraint("accuracy", 0.0)
    t.set_constraint("failure", 1.0)
    t.set_user_attr("failure_class", "build-error")
    study.tell(t, state=TrialState.PRUNED)
    o = observation(study.trials[0], {}, 40.0)
    assert o is not None and o.feasible is False and o.log_ratio is None


def test_a_warm_start_takes_other_models_winners_never_the_same_models(tmp_path) -> None:
    storage = optuna.storages.InMemoryStorage()
    for name, model in (("other-model", "m2"), ("same-model", "m1")):
        src = optuna.create_study(storage=storage, study_name=name)
        for key, value in {**warm_start.identity(model, {"cpu": "x"}), "backend": "onnxruntime"}.items():
            src.set_user_attr(key, value)
        for route, source in (
            (SPACE.default_route(), "baseline"),
            (SPACE.complete({"precision": "fp16", "keep": "none"}), None),
        ):
            src.enqueue_trial(route, user_attrs={"source": source} if source else {})
            t = src.ask()
            SPACE.suggest(t)
            _tell(src, t, route)
        src.set_user_attr("confirmation", {"winner_trial": 1})
    study = _study(0, storage=storage, name="new")
    doc = warm_start.warm_start(study, storage, SPACE, "onnxruntime", warm_start.identity("m1", {"cpu": "x"}))
    assert [s["study"] for s in doc["sources"]] == ["other-model"]  # the same model is never a source
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.user_attrs.get("source") for t in waiting] == ["baseline", "warm-start"]  # after the default
    assert waiting[1].system_attrs["fixed_params"] == SPACE.complete({"precision": "fp16", "keep": "none"})
    assert len(study.user_attrs[A.WARM_START]["observations"]) == 2


def test_a_route_projects_onto_another_space() -> None:
    other = SearchSpace((Param("precision", ("fp32", "fp16"), "fp32"), Param("threads", (0, 1), 0)))
    assert warm_start.project({"precision": "int8", "threads": 1, "fusion": True}, other) == {
        "precision": "fp32",
        "threads": 1,
    }


@pytest.mark.parametrize("mode", ["auto", "off"])
def test_warm_start_is_a_run_setting(tmp_path, mode: str) -> None:
    from tests.models import conv_model
    from tuner.spec import load_spec
    from tuner.spec.toml import dumps

    spec = tmp_path / "s.toml"
    spec.write_text(
        dumps(
            {
                "study": {"name": "s"},
                "model": {"path": str(conv_model(tmp_path / "m.onnx"))},
                "accuracy": {"metric": "max_abs", "tolerance": 1.0},
                "backend": {"name": "onnxruntime"},
                "run": {"budget": 2, "warm_start": mode},
            }
        )
    )
    run = load_spec(spec).run
    assert run.warm_start == mode and run.sampler == "local"


def _raced_study() -> tuple[optuna.Study, dict[str, dict]]:
    """A study with the baseline, a confirmed leader A, a route B racing cannot tell from A and a slower route C."""
    study = _study(0)
    routes = {
        "A": SPACE.complete({"precision": "fp16", "keep": "none"}),
        "B": SPACE.complete({"threads": 1}),
        "C": SPACE.complete({"fusion": True, "attention": False}),
    }
    speedups = {None: (1.0, 1.0, 1.0), "A": (2.0, 1.9, 2.1), "B": (1.95, 1.85, 2.05), "C": (1.5, 1.4, 1.6)}
    for name, route in [(None, SPACE.default_route()), *routes.items()]:
        if name is not None:
            study.enqueue_trial(route)
        trial = study.ask()
        SPACE.suggest(trial)
        est, low, high = speedups[name]
        trial.set_user_attr(A.PAIRED, True)
        trial.set_user_attr(A.SPEEDUP_PAIRED, est)
        trial.set_user_attr(A.SPEEDUP_PAIRED_CI, [low, high])
        trial.set_constraint("accuracy", -1.0)
        trial.set_constraint("failure", -1.0)
        study.tell(trial, 40.0 / est)
    study.set_user_attr(A.RACING, {"1": {"speedup_refined": 2.0, "speedup_refined_ci": [1.9, 2.1], "remeasured": 1}})
    return study, routes


def test_routes_racing_cannot_tell_from_the_confirmed_best_are_centres_too() -> None:
    study, routes = _raced_study()
    local = study.sampler.base
    centres = local.centres(study.get_trials(deepcopy=False), study)
    assert centres == [routes["A"], routes["B"]]  # C's interval lies below A's: not a centre


def test_restarts_follow_the_centres_fastest_first_each_against_its_own_value() -> None:
    import math

    study, routes = _raced_study()
    local = study.sampler.base
    trials = study.get_trials(deepcopy=False)
    starts = list(local.starts(trials, study, local.observations(trials, study)))
    assert [centres for centres, _ in starts] == [[routes["A"], routes["B"]], [routes["C"]], [SPACE.default_route()]]
    references = [reference for _, reference in starts]
    assert references == pytest.approx([math.log(1 / 2.0), math.log(1 / 1.5), 0.0])


def test_a_neighbourhood_whose_best_is_not_worth_a_build_gives_way_to_the_next() -> None:
    import numpy as np

    from tuner.study.local_search import WORTH, first_worth_building

    spent = ([{"x": 1}], np.array([WORTH / 10]), WORTH)
    promising = ([{"x": 2}], np.array([WORTH * 2]), WORTH)
    assert first_worth_building([spent, promising])[0] == [{"x": 2}]
    assert first_worth_building([spent, ([{"x": 3}], np.array([0.0]), WORTH)])[0] == [{"x": 1}]  # none: the first
    assert first_worth_building([spent, promising], learnt=False)[0] == [{"x": 1}]  # no model: scores mean nothing
    assert first_worth_building([])[0] == []
    worth_here = ([{"x": 4}], np.array([WORTH / 2]), WORTH / 4)  # the centres' own, lower threshold
    assert first_worth_building([worth_here, promising])[0] == [{"x": 4}]


def test_the_centres_candidates_need_less_expected_improvement_than_a_restart_s(monkeypatch) -> None:
    """A restart counts its improvement from a slower route, so the centres' candidates get a lower threshold."""
    from tuner.study import local_search

    assert local_search.CENTRE_WORTH < local_search.WORTH
    offered = []

    def first(neighbourhoods, learnt=True):
        offered.extend(worth for _, _, worth in neighbourhoods)
        return [], np.zeros(0)

    monkeypatch.setattr(local_search, "first_worth_building", first)
    study, _ = _raced_study()
    study.sampler.base.sample_relative(study, study.ask(), study.sampler.base.infer_relative_search_space(study, None))
    assert offered[0] == local_search.CENTRE_WORTH and set(offered[1:]) == {local_search.WORTH}
    assert local_search.LocalSearchSampler(SPACE, previous=True).centre_worth == local_search.WORTH


def test_restarts_start_only_from_routes_within_restart_within_of_the_best() -> None:
    study, routes = _raced_study()
    local = study.sampler.base
    trials = study.get_trials(deepcopy=False)
    local.restart_within = 1.6  # C is 1.33x the best's latency, the default route 2x
    starts = [centres for centres, _ in local.starts(trials, study, local.observations(trials, study))]
    assert starts == [[routes["A"], routes["B"]], [routes["C"]]]


def test_a_restart_probes_its_routes_nearest_ring_the_centres_one_ring_more() -> None:
    from tuner.study.local_search import REACH, RESTART_REACH

    local = _study(0).sampler.base
    default = SPACE.default_route()
    tried = {canonical_route(default)}
    g = local.groups
    assert {g.distance(default, r) for r in local.neighbourhood([default], tried, RESTART_REACH)} == {1}
    assert max(g.distance(default, r) for r in local.neighbourhood([default], tried, REACH)) == 1 + REACH


def test_a_large_space_s_neighbourhoods_are_collected_once_per_centre_and_capped() -> None:
    large = SearchSpace(tuple(Param(f"k{i}", tuple(range(10)), 0) for i in range(10)))  # 10^10 routes, 10 groups
    sampler = _study(0, large).sampler
    local = next(s for s in (sampler, *vars(sampler).values()) if hasattr(s, "around"))
    calls: list[dict] = []
    within = local.groups.within
    object.__setattr__(local.groups, "within", lambda centre, *a: calls.append(centre) or within(centre, *a))
    centres = [large.default_route(), large.complete({"k0": 1}), large.complete({"k1": 1})]  # ~3,700 routes each
    first = local.neighbourhood(centres, set())
    again = local.neighbourhood(centres, {canonical_route(first[0])})
    assert calls == centres  # one collection per centre, reused by the second proposal
    assert len(first) == len(again) == NEIGHBOURS_MAX  # the centres' rings hold more: drawn at random
    assert canonical_route(first[0]) not in {canonical_route(r) for r in again}


def _observed(routes: list[dict], feasible=lambda r: True) -> list:
    """Observations of `routes`; the infeasible ones failed the gate (never timed)."""
    from tuner.study.surrogate import Observation

    return [Observation(r, math.log(latency(r) / 40.0) if feasible(r) else None, feasible(r)) for r in routes]


BASE = {"precision": "fp32", "fusion": False, "threads": 0}


@pytest.mark.parametrize("additive", [False, True])
def test_the_additive_model_predicts_two_helpful_moves_together_faster_than_either(additive: bool) -> None:
    """1 thread helps and fp16 helps, each seen alone; only the additive model expects both together to beat both
    (a forest predicts averages of what it saw, never below the fastest)."""
    from tuner.study.surrogate import Encoder, Surrogate

    seen = [BASE, {**BASE, "threads": 1}, {**BASE, "precision": "fp16", "keep": "some"}, {**BASE, "threads": 2}]
    model = Surrogate(Encoder(SPACE), _observed(seen), seed=0, additive=additive)
    both = {**BASE, "precision": "fp16", "keep": "some", "threads": 1}
    mean, _, _ = model.predict([both])
    fastest_seen = min(math.log(latency(r) / 40.0) for r in seen)
    assert bool(mean[0] < fastest_seen) is additive


@pytest.mark.parametrize("linear", [False, True])
def test_the_linear_feasibility_model_carries_a_variant_s_failure_to_its_other_routes(linear: bool) -> None:
    """int8 failed the gate at two thread counts and never passed; with the linear model its route at the third
    thread count is expected infeasible, and routes of passing variants stay likely feasible."""
    from tuner.study.surrogate import Encoder, Surrogate

    def feasible(r: dict) -> bool:
        return r["precision"] != "int8"

    seen = [
        BASE,
        {**BASE, "threads": 1},
        {**BASE, "threads": 2},
        {**BASE, "fusion": True, "attention": False},
        {**BASE, "precision": "fp16", "keep": "none"},
        {**BASE, "precision": "fp16", "keep": "none", "threads": 2},
        {**BASE, "precision": "int8"},
        {**BASE, "precision": "int8", "threads": 2},
    ]
    model = Surrogate(Encoder(SPACE), _observed(seen, feasible), seed=0, linear=linear)
    _, _, p = model.predict(
        [{**BASE, "precision": "int8", "threads": 1}, {**BASE, "precision": "fp16", "keep": "none", "threads": 1}]
    )
    with_forest_alone = Surrogate(Encoder(SPACE), _observed(seen, feasible), seed=0).predict(
        [{**BASE, "precision": "int8", "threads": 1}]
    )[2][0]
    assert p[1] > 0.5
    if linear:
        assert p[0] < with_forest_alone and p[0] < 0.5 * p[1]
    else:
        assert p[0] == with_forest_alone


QUANT = SearchSpace(
    (
        Param("precision", ("fp32", "int8_static", "int8_dynamic"), "fp32"),
        Param("per_channel", (True, False), True, when=lambda r: r["precision"] != "fp32"),
        Param("threads", (0, 1, 2), 0),
    )
)


def test_a_sub_knob_value_s_failure_stays_with_its_variant() -> None:
    """Static int8 with per-channel weights and dynamic int8 per-tensor failed the gate. Encoded within its variant,
    dynamic int8 with per-channel weights (never tried) keeps a better chance than either failing variant's routes,
    and a better one than with `per_channel = True` shared between the variants."""
    from tuner.study.surrogate import Encoder, Observation, Surrogate

    fp32 = [QUANT.complete({"threads": t}) for t in (0, 1, 2)]
    failed = [
        QUANT.complete({"precision": "int8_static", "per_channel": True}),
        QUANT.complete({"precision": "int8_dynamic", "per_channel": False}),
    ]
    seen = [Observation(r, -0.1 * i, True) for i, r in enumerate(fp32)] + [Observation(r, None, False) for r in failed]
    asked = [
        QUANT.complete({"precision": "int8_dynamic", "per_channel": True, "threads": 1}),
        QUANT.complete({"precision": "int8_static", "per_channel": True, "threads": 1}),
    ]

    def chance(encoder: Encoder) -> np.ndarray:
        return Surrogate(encoder, seen, seed=0, linear=True).predict(asked)[2]

    within = chance(Encoder(QUANT, nested=True))
    assert within[0] > within[1] and within[0] > chance(Encoder(QUANT))[0]


def test_a_sub_knob_value_s_speed_up_stays_with_its_variant() -> None:
    """Per-channel weights made static int8 fast; dynamic int8 was timed only per-tensor, as slow as fp32. Learnt
    within its variant, dynamic int8 with per-channel weights (never timed) is not expected to share static int8's
    speed-up, as it is with one column per knob value (the latency models as they were before)."""
    from tuner.study.surrogate import Encoder, Observation, Surrogate

    seen = [Observation(QUANT.complete({"threads": t}), 0.0, True) for t in (0, 1, 2)]
    seen += [
        Observation(QUANT.complete({"precision": "int8_static", "per_channel": True}), -0.5, True),
        Observation(QUANT.complete({"precision": "int8_static", "per_channel": False}), 0.0, True),
        Observation(QUANT.complete({"precision": "int8_dynamic", "per_channel": False}), 0.0, True),
    ]
    asked = [QUANT.complete({"precision": "int8_dynamic", "per_channel": True, "threads": 2})]
    nested = Encoder(QUANT, nested=True)
    within = Surrogate(nested, seen, seed=0).predict(asked)[0][0]
    shared = Surrogate(Encoder(QUANT), seen, seed=0).predict(asked)[0][0]
    assert within > shared


def test_a_slow_route_passed_the_gate_but_the_full_check_is_learnt_from_checked_routes() -> None:
    """fp16 failed the full accuracy check twice and was stopped as slow (gate passed, never fully checked) three
    times (with the fusion): its next route with the fusion is expected infeasible (a slow route is not counted as
    accurate), a fusion route of fp32 feasible."""
    from tuner.study.surrogate import Encoder, Observation, Surrogate

    fp16 = {**BASE, "precision": "fp16", "keep": "none"}
    seen = [Observation({**BASE, "threads": t}, -0.1 * t, True) for t in (0, 1, 2)]
    seen += [Observation({**fp16, "threads": t}, -0.3, False) for t in (0, 1)]
    seen += [
        Observation({**fp16, "fusion": True, "attention": a, "threads": t}, 0.2, True, checked=False)
        for a, t in ((True, 0), (False, 1), (True, 2))
    ]
    asked = [{**fp16, "fusion": True, "attention": False, "threads": 2}, {**BASE, "fusion": True, "attention": True}]
    staged = Surrogate(Encoder(SPACE), seen, seed=0, linear=True).predict(asked)[2]
    assert staged[0] < 0.3
    assert staged[1] > 0.5


def test_proposals_alternate_between_the_forest_and_the_additive_model() -> None:
    from tuner.study.local_search import LocalSearchSampler

    sampler = LocalSearchSampler(SPACE, seed=0)
    models = []
    sampler.surrogate = lambda observations, additive=False: models.append(additive)  # type: ignore[method-assign]
    study = optuna.create_study(sampler=sampler)
    for _ in range(4):
        t = study.ask()
        route = SPACE.suggest(t)
        _tell(study, t, route)
    assert models == [False, True, False, True]
    forest_only = LocalSearchSampler(SPACE, seed=0, portfolio=False)
    forest_only.surrogate = lambda observations, additive=False: models.append(additive)  # type: ignore[method-assign]
    study = optuna.create_study(sampler=forest_only)
    t = study.ask()
    _tell(study, t, SPACE.suggest(t))
    assert models[-1] is False
