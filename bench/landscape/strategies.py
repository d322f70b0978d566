"""Search strategies replayed against a landscape, each producing the sequence of routes it evaluated.

Optuna strategies drive ask/tell in-process (InMemoryStorage) with the worker's own pieces:
`tuner.study.sampler.sampler_for` (make_sampler's sampler, seeded per run) for the sampler, `SearchSpace.suggest` for the route and
`tuner.study.outcome.record` (judge + constraint keys + tell) for the outcome, like
`tuner.worker.loop.Worker`. Alternatives change exactly one of those pieces. A "build" is a distinct
route evaluated; a proposal already evaluated is answered from the cache, as the worker does.

Every step also records the route the strategy would *deliver* if it stopped there, by its own rule:
ours (a `PairedPolicy`) measures each timed trial paired against the baseline and races close leaders
(`bench.landscape.paired`), delivering the best pooled estimate; GPT and Olive deliver the fastest
single measurement among the routes their rules accept.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Protocol

import numpy as np
import optuna
from optuna.trial import TrialState

from bench.landscape.oracle import Oracle
from bench.landscape.paired import SLOW, PairedMeter, PairedPolicy, Race
from tuner.spec import RunSpec
from tuner.space import Route, SearchSpace, route_hash
from tuner.study import outcome
from tuner.study.sampler import NoRepeatSampler, sampler_for
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
    delivered: str | None = None  # the route the strategy would deliver after this step
    pruned: bool = False  # timing stopped early: clearly slower than the incumbent


@dataclass
class Evaluator:
    """Evaluates routes against the oracle, counting builds; with `cache`, a repeat costs nothing.

    With a `policy`, timed routes are measured paired against the baseline (the first route timed
    must be the default) and the feasible ones raced; the value reported is the baseline's own
    measurement times the paired ratio. Without one, a route's value is its single measurement and
    the delivered route is the feasible one with the lowest observed value.
    """

    oracle: Oracle
    rng: np.random.Generator
    budget: int
    cache: bool = True
    gate: bool = True
    policy: PairedPolicy | None = None
    steps: list[Step] = field(default_factory=list)
    builds: int = 0
    seen: dict[str, J.Result] = field(default_factory=dict)
    race: Race | None = None
    base_value: float = math.nan
    fastest: tuple[float, str | None] = (math.inf, None)

    @property
    def done(self) -> bool:
        return self.builds >= self.budget

    def __call__(self, route: Route) -> J.Result:
        key = route_hash(route)
        cached = self.seen.get(key) if self.cache else None
        result = cached or self._measure(key, self.oracle.evaluate(route, self.rng, gate=self.gate))
        build = cached is None and result.status != J.INVALID_ROUTE  # a known-invalid route is never built
        self.builds += build
        self.seen.setdefault(key, result)
        j = self.judge(result)
        if self.race is None and j.feasible and j.value is not None and j.value < self.fastest[0]:
            self.fastest = (j.value, key)
        if self.race is not None:
            self.race.race()
        delivered = self.race.delivered if self.race is not None else self.fastest[1]
        self.steps.append(Step(key, build, result.status, j.value, j.feasible, delivered, result.status == J.SLOW))
        return result

    def judge(self, result: J.Result) -> outcome.Judgement:
        """How the worker records `result` (paired values relative to the baseline trial's)."""
        base = self.base_value if self.race is not None else None
        return outcome.judge(result, self.oracle.tolerance, self.oracle.statistic, base)

    def _measure(self, key: str, result: J.Result) -> J.Result:
        """The paired measurement of a timed result (unchanged without a policy or before the baseline),
        in the form the trial's child reports it (`Result.paired`, status `slow` when pruned)."""
        if self.policy is None or not result.latency:
            return result
        if self.race is None:  # the baseline's own trial: its measurement anchors the study's values
            if key != route_hash(self.oracle.space.default_route()):
                raise ValueError("paired measurement needs the default route measured first")
            self.base_value = float(result.latency[self.oracle.statistic])
            self.race = Race(PairedMeter(self.oracle, self.policy, self.rng), key)
            return result
        m = self.race.measure(key)
        paired = {"paired": True, "speedup": math.exp(-m.log_ratio), "ci": [math.exp(-m.high), math.exp(-m.low)],
                  "stop": m.stopped, "cycles": m.cycles, "running": [list(r) for r in m.running]}
        if m.stopped == SLOW:  # pruned during timing: the full accuracy check never ran
            return replace(result, status=J.SLOW, accuracy=None, paired=paired)
        result = replace(result, paired=paired)
        if self.judge(result).feasible:
            self.race.add(key, m)
        return result


# -- Optuna strategies ----------------------------------------------------------------------------


class Encoding(Protocol):
    """How routes are suggested to and outcomes told to Optuna."""

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route: ...

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, ev: Evaluator) -> None: ...


class Ours:
    """The worker's encoding: conditional categorical knobs; outcome.record (PRUNED failures and slow
    routes with their running paired estimate, two constraints, paired values)."""

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route:
        return space.suggest(trial)

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, ev: Evaluator) -> None:
        base = ev.base_value if ev.race is not None else None
        outcome.record(study, trial, result, ev.oracle.tolerance, ev.oracle.statistic, {}, base)


class Plain(Ours):
    """Stock Optuna use: feasible routes COMPLETE, everything else FAIL (no constraints: samplers ignore FAIL)."""

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, ev: Evaluator) -> None:
        j = ev.judge(result)
        if j.feasible:
            study.tell(trial, j.value)
        else:
            study.tell(trial, state=TrialState.FAIL)


class Olive:
    """Olive's OptunaSampler (olive/search/samplers/optuna_sampler.py): every knob a categorical *index*;
    a conditional knob is named after its parents' values (`name___v1 v2`) and always sampled; one
    objective per metric — latency, then accuracy (its loss), both minimised — and failures PRUNED.
    Accuracy is a goal checked afterwards (the best candidate meets it), not a constraint."""

    directions = ("minimize", "minimize")

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route:
        route: Route = {}
        parents = condition_parents(space)
        for p in space.params:
            name = p.name if not parents[p.name] else f"{p.name}___" + " ".join(str(route.get(q)) for q in parents[p.name])
            index = trial.suggest_categorical(name, list(range(len(p.choices))))
            if p.active(route):
                route[p.name] = p.choices[index]
        return route

    def tell(self, study: optuna.Study, trial: optuna.Trial, result: J.Result, ev: Evaluator) -> None:
        if result.latency:
            accuracy = result.accuracy if result.accuracy is not None and math.isfinite(result.accuracy) else float(sys.maxsize)
            study.tell(trial, [float(result.latency[ev.oracle.statistic]), accuracy])
        else:
            study.tell(trial, state=TrialState.PRUNED)


@cache
def condition_parents(space: SearchSpace) -> dict[str, tuple[str, ...]]:
    """For each knob, the earlier knobs whose value alone decides whether it is active (its Olive parents)."""
    routes = space.routes()
    names = space.names()
    out: dict[str, tuple[str, ...]] = {}
    for i, p in enumerate(space.params):
        found = []
        for q in names[:i] if p.when is not None else ():
            groups: dict[tuple, set[bool]] = {}
            for r in routes:
                groups.setdefault(tuple(r.get(n) for n in names[:i] if n != q), set()).add(p.name in r)
            if any(len(v) > 1 for v in groups.values()):
                found.append(q)
        out[p.name] = tuple(found)
    return out


def optuna_search(
    oracle: Oracle, ev: Evaluator, sampler: optuna.samplers.BaseSampler, encoding: Encoding,
    baseline: bool = True, reask_duplicates: bool = False,
) -> None:
    """Ask/tell until the build budget is spent (or the sampler keeps re-proposing evaluated routes).

    With `baseline`, the default route is enqueued first, as `tuner run` does. With
    `reask_duplicates` (Olive), a proposal whose sampled indices were already asked is left
    unanswered (RUNNING) and asked again.
    """
    study = optuna.create_study(directions=list(getattr(encoding, "directions", ("minimize",))), sampler=sampler)
    if baseline:
        study.enqueue_trial(oracle.space.default_route(), user_attrs={"source": "baseline"})
    asked: set[tuple] = set()
    trials = 0
    while not ev.done and trials < TRIAL_CAP * ev.budget:
        trials += 1
        trial = study.ask()
        route = encoding.suggest(trial, oracle.space)
        point = tuple(sorted(trial.params.items()))
        if reask_duplicates and point in asked:
            continue
        asked.add(point)
        encoding.tell(study, trial, ev(route), ev)


def ours_sampler(seed: int) -> optuna.samplers.BaseSampler:
    """Exactly what a worker of a default study gets (with `seed` in place of the per-process seed)."""
    return sampler_for(RunSpec(budget=1), seed)


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

    Returns the "positive" knobs by trtexec 11.1's rule: a one-off value that did not crash and was
    faster than the baseline as measured (`!crashed && gpu < baseline`; accuracy is not checked).
    """
    space = oracle.space
    default = space.default_route()
    base = ev(default)
    base_v = float(base.latency[oracle.statistic]) if base.latency else math.inf
    positive: set[str] = set()
    for name in default:
        for value in space.param(name).choices:
            if value == space.param(name).default or ev.done:
                continue
            r = ev(_with(space, {name: value}))
            if r.latency and float(r.latency[oracle.statistic]) < base_v:
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
    """A named way to spend builds on a landscape; `policy`: measured and delivered as ours are;
    `candidate`: one of the samplers the default is chosen from."""

    name: str
    label: str
    run: Callable[[Oracle, Evaluator, int], None]
    cache: bool = True
    gate: bool = True
    policy: PairedPolicy | None = None
    candidate: bool = False

    def trace(self, oracle: Oracle, budget: int, seed: int) -> list[Step]:
        """The steps of one run with `seed` (noise and sampler)."""
        return self.evaluate(oracle, budget, seed).steps

    def evaluate(self, oracle: Oracle, budget: int, seed: int) -> Evaluator:
        """One run with `seed`: the evaluator with its steps and, for ours, its race."""
        ev = Evaluator(oracle, np.random.default_rng([seed, 7]), budget, cache=self.cache, gate=self.gate, policy=self.policy)
        self.run(oracle, ev, seed)
        return ev


def _optuna(factory: Callable[[int], optuna.samplers.BaseSampler], encoding: Encoding, **kw: bool) -> Callable[[Oracle, Evaluator, int], None]:
    return lambda oracle, ev, seed: optuna_search(oracle, ev, factory(seed), encoding, **kw)


def tpe(startup: int = 8, multivariate: bool = True, no_repeat: bool = True) -> Callable[[int], optuna.samplers.BaseSampler]:
    """A TPE variant of make_sampler's (group and constant liar as it has them)."""
    def factory(seed: int) -> optuna.samplers.BaseSampler:
        base = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=multivariate,
                                          group=multivariate, constant_liar=multivariate)
        return NoRepeatSampler(base, seed) if no_repeat else base
    return factory


def gp(seed: int) -> optuna.samplers.BaseSampler:
    """make_sampler's GP."""
    return sampler_for(RunSpec(budget=1, sampler="gp"), seed)


def random_search(seed: int) -> optuna.samplers.BaseSampler:
    """make_sampler's random sampler."""
    return sampler_for(RunSpec(budget=1, sampler="random"), seed)


def olive_tpe(seed: int) -> optuna.samplers.BaseSampler:
    """Olive's TPE settings (tpe_sampler.py): multivariate and group, Optuna's other defaults."""
    return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed)


OURS = PairedPolicy()


def _ours(name: str, label: str, factory: Callable[[int], optuna.samplers.BaseSampler], policy: PairedPolicy = OURS,
          candidate: bool = True, **kw: bool) -> Strategy:
    return Strategy(name, f"{label}; paired measurement + racing ({policy.label()})", _optuna(factory, Ours()),
                    policy=policy, candidate=candidate, **kw)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    _ours("ours", "default: make_sampler (TPE multivariate+group+liar, 4 start-up, no-repeat step) + our encoding + cache", ours_sampler),
    _ours("tpe-startup-8", "TPE as the default with 8 start-up trials (the default until the delivered-route benchmark)", tpe(startup=8)),
    _ours("tpe-startup-4", "TPE as the default with 4 start-up trials", tpe(startup=4)),
    _ours("tpe-startup-16", "TPE as the default with 16 start-up trials", tpe(startup=16)),
    _ours("tpe-repeats", "the default TPE without the no-repeat step", tpe(no_repeat=False)),
    _ours("tpe-independent", "univariate TPE + no-repeat step", tpe(multivariate=False)),
    _ours("random", "random search (make_sampler 'random')", random_search),
    _ours("gp", "GP (make_sampler 'gp', with the no-repeat step)", gp),
    *(_ours(f"ours-leak-{leak:g}", "the default sampler", ours_sampler, replace(OURS, leak=leak), candidate=False) for leak in (0.0, 1.0)),
    _ours("ours-no-prune", "the default sampler, timing never stopped early", ours_sampler, replace(OURS, prune=False), candidate=False),
    Strategy("ours-unpaired", "the default sampler and encoding, each trial one un-paired measurement, delivering the fastest one",
             _optuna(ours_sampler, Ours())),
    Strategy("tpe-plain", "default sampler, no failure/constraint encoding (infeasible and failed = FAIL), un-paired", _optuna(ours_sampler, Plain())),
    Strategy("tpe-nocache", "default sampler + encoding, no duplicate cache (repeats rebuilt), un-paired", _optuna(ours_sampler, Ours()), cache=False),
    Strategy("olive", "Olive: multi-objective TPE (latency, accuracy), index encoding, failures pruned, duplicates re-asked, "
             "no baseline; delivers its best candidate (accuracy goal met, lowest measured latency)",
             _optuna(olive_tpe, Olive(), baseline=False, reask_duplicates=True), gate=False),
    Strategy("gpt-fast", "GPT fast: default + one knob at a time; delivers the fastest iteration that passed accuracy",
             lambda o, ev, seed: gpt_fast(o, ev), gate=False),
    Strategy("gpt-mixed", "GPT mixed: fast, then all combinations of the knobs trtexec 11.1 counts positive (did not crash and faster)",
             lambda o, ev, seed: gpt_mixed(o, ev), gate=False),
)}
DEFAULT_SET = ("ours", "tpe-startup-8", "tpe-startup-16", "random",
               "ours-leak-0", "ours-leak-1", "ours-unpaired", "olive", "gpt-fast", "gpt-mixed")
