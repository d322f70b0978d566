"""Search strategies replayed against a landscape, each producing the sequence of routes it evaluated.

Optuna strategies drive ask/tell in-process (InMemoryStorage) with the worker's own pieces:
`tuner.study.sampler.make_sampler` for the sampler, `SearchSpace.suggest` for the route and
`tuner.study.outcome.record` (judge + constraint keys + tell) for the outcome, like
`tuner.worker.loop.Worker`. Alternatives change exactly one of those pieces. A "build" is a distinct
route evaluated; a proposal already evaluated is answered from the cache, as the worker does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import optuna
from optuna.trial import TrialState

from bench.landscape.oracle import Oracle
from tuner.spec import RunSpec
from tuner.space import Route, SearchSpace, route_hash
from tuner.study import outcome
from tuner.study.sampler import NoRepeatSampler, make_sampler
from tuner import job as J

TRIAL_CAP = 3  # a run stops after TRIAL_CAP x budget trials, whatever its builds
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)


@dataclass(frozen=True)
class Step:
    """One evaluation: which route, whether it cost a build, what was observed."""

    key: str
    build: bool
    status: str
    value: float | None  # the objective as observed (None unless timed)
    feasible: bool


@dataclass
class Evaluator:
    """Evaluates routes against the oracle, counting builds; with `cache`, a repeat costs nothing."""

    oracle: Oracle
    rng: np.random.Generator
    budget: int
    cache: bool = True
    gate: bool = True
    steps: list[Step] = field(default_factory=list)
    builds: int = 0
    seen: dict[str, J.Result] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.builds >= self.budget

    def __call__(self, route: Route) -> J.Result:
        key = route_hash(route)
        cached = self.seen.get(key) if self.cache else None
        result = cached or self.oracle.evaluate(route, self.rng, gate=self.gate)
        build = cached is None and result.status != J.INVALID_ROUTE  # a known-invalid route is never built
        self.builds += build
        self.seen.setdefault(key, result)
        j = outcome.judge(result, self.oracle.tolerance, self.oracle.statistic)
        self.steps.append(Step(key, build, result.status, j.value, j.feasible))
        return result


# -- Optuna strategies ----------------------------------------------------------------------------


class Encoding(Protocol):
    """How routes are suggested to and outcomes told to Optuna."""

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route: ...

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, oracle: Oracle) -> None: ...


class Ours:
    """The worker's encoding: conditional categorical knobs; outcome.record (PRUNED failures, two constraints)."""

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route:
        return space.suggest(trial)

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, oracle: Oracle) -> None:
        outcome.record(study, trial, result, oracle.tolerance, oracle.statistic, {})


class Plain(Ours):
    """Stock Optuna use: feasible routes COMPLETE, everything else FAIL (no constraints: samplers ignore FAIL)."""

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, oracle: Oracle) -> None:
        j = outcome.judge(result, oracle.tolerance, oracle.statistic)
        if j.feasible:
            study.tell(trial, j.value)
        else:
            study.tell(trial, state=TrialState.FAIL)


class OliveStyle:
    """Olive's OptunaSampler: every knob a categorical *index*, always sampled (inactive ones padded);
    failures PRUNED; accuracy only a post-hoc filter (infeasible routes COMPLETE with their latency)."""

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route:
        route: Route = {}
        for p in space.params:
            index = trial.suggest_categorical(p.name, list(range(len(p.choices))))
            if p.active(route):
                route[p.name] = p.choices[index]
        return route

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, oracle: Oracle) -> None:
        if result.latency:
            study.tell(trial, float(result.latency[oracle.statistic]))
        else:
            study.tell(trial, state=TrialState.PRUNED)


def optuna_search(
    oracle: Oracle, ev: Evaluator, sampler: optuna.samplers.BaseSampler, encoding: Encoding,
    baseline: bool = True, reask_duplicates: bool = False,
) -> None:
    """Ask/tell until the build budget is spent (or the sampler keeps re-proposing evaluated routes).

    With `baseline`, the default route is enqueued first, as `tuner run` does. With
    `reask_duplicates` (Olive), a proposal already evaluated is left unanswered and asked again.
    """
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if baseline:
        study.enqueue_trial(oracle.space.default_route(), user_attrs={"source": "baseline"})
    trials = 0
    while not ev.done and trials < TRIAL_CAP * ev.budget:
        trials += 1
        trial = study.ask()
        route = encoding.suggest(trial, oracle.space)
        if reask_duplicates and route_hash(route) in ev.seen:
            continue
        encoding.tell(study, trial, ev(route), oracle)


def ours_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """Exactly what a worker of a default study gets."""
    return make_sampler(RunSpec(budget=1, seed=seed), 0)


# -- GPT's `fast` and `mixed` ---------------------------------------------------------------------


def _with(space: SearchSpace, overrides: Route) -> Route:
    """The default route with `overrides`; knobs activated by them start at their defaults."""
    route: Route = {}
    for p in space.params:
        if p.active(route):
            route[p.name] = overrides.get(p.name, p.default)
    return route


def gpt_fast(oracle: Oracle, ev: Evaluator) -> set[str]:
    """The default route, then each knob active in it changed alone to each other value, in order.

    Returns which knobs had a feasible one-off value strictly faster than the default (as observed).
    """
    space = oracle.space
    default = space.default_route()
    base = ev(default)
    base_v = outcome.judge(base, oracle.tolerance, oracle.statistic)
    positive: set[str] = set()
    for name in default:
        for value in space.param(name).choices:
            if value == space.param(name).default or ev.done:
                continue
            j = outcome.judge(ev(_with(space, {name: value})), oracle.tolerance, oracle.statistic)
            if j.feasible and (not base_v.feasible or j.value < base_v.value):
                positive.add(name)
    return positive


def gpt_mixed(oracle: Oracle, ev: Evaluator) -> None:
    """`fast`, then every combination of the positive knobs (and the knobs they activate)."""
    positive = gpt_fast(oracle, ev)
    space = oracle.space
    fixed = {name: [value] for name, value in space.default_route().items() if name not in positive}
    for route in space.restrict(fixed).routes():
        if ev.done:
            return
        if route_hash(route) not in ev.seen:
            ev(route)


# -- the registry --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Strategy:
    """A named way to spend builds on a landscape."""

    name: str
    label: str
    run: Callable[[Oracle, Evaluator, int], None]
    cache: bool = True
    gate: bool = True

    def trace(self, oracle: Oracle, budget: int, seed: int) -> list[Step]:
        """The steps of one run with `seed` (noise and sampler)."""
        ev = Evaluator(oracle, np.random.default_rng([seed, 7]), budget, cache=self.cache, gate=self.gate)
        self.run(oracle, ev, seed)
        return ev.steps


def _optuna(factory: Callable[[int], optuna.samplers.BaseSampler], encoding: Encoding, **kw: bool) -> Callable[[Oracle, Evaluator, int], None]:
    return lambda oracle, ev, seed: optuna_search(oracle, ev, factory(seed), encoding, **kw)


def previous_default(seed: int) -> optuna.samplers.BaseSampler:
    """make_sampler's TPE before NoRepeatSampler (the default until this benchmark)."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=True, group=True, constant_liar=True)


def independent(seed: int) -> optuna.samplers.BaseSampler:
    """Univariate TPE (no joint model of the knobs), with the same no-repeat step as the default."""
    return NoRepeatSampler(optuna.samplers.TPESampler(seed=seed, n_startup_trials=8, multivariate=False), seed)


def gp(seed: int) -> optuna.samplers.BaseSampler:
    """make_sampler's GP."""
    return make_sampler(RunSpec(budget=1, sampler="gp", seed=seed), 0)


def random_search(seed: int) -> optuna.samplers.BaseSampler:
    """make_sampler's random sampler."""
    return make_sampler(RunSpec(budget=1, sampler="random", seed=seed), 0)


def olive_tpe(seed: int) -> optuna.samplers.BaseSampler:
    """Olive's TPE settings (tpe_sampler.py): multivariate and group, Optuna's other defaults."""
    return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ours", "default: make_sampler (TPE multivariate+group+liar, 8 startup, no-repeat step) + our encoding + cache", _optuna(ours_sampler, Ours())),
    Strategy("tpe-repeats", "previous default: the same TPE without the no-repeat step", _optuna(previous_default, Ours())),
    Strategy("tpe-independent", "univariate TPE + no-repeat step + our encoding", _optuna(independent, Ours())),
    Strategy("gp", "GP (make_sampler 'gp', with the no-repeat step) + our encoding", _optuna(gp, Ours())),
    Strategy("tpe-plain", "default sampler, no failure/constraint encoding (infeasible and failed = FAIL)", _optuna(ours_sampler, Plain())),
    Strategy("tpe-nocache", "default sampler + encoding, no duplicate cache (repeats rebuilt)", _optuna(ours_sampler, Ours()), cache=False),
    Strategy("random", "random search (make_sampler 'random')", _optuna(random_search, Ours())),
    Strategy("olive-tpe", "Olive-style TPE: index encoding, failures pruned, accuracy post-hoc, no baseline", _optuna(
        olive_tpe, OliveStyle(), baseline=False, reask_duplicates=True), gate=False),
    Strategy("gpt-fast", "GPT fast: default + one knob at a time", lambda o, ev, seed: gpt_fast(o, ev), gate=False),
    Strategy("gpt-mixed", "GPT mixed: fast, then all combinations of the knobs that helped", lambda o, ev, seed: gpt_mixed(o, ev), gate=False),
)}
