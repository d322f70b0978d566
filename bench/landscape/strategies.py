"""Search strategies on a landscape: the tuner's own study (through the simulation runner) and the tools it is compared
with.

A *study* strategy is a sampler in the simulated study of `bench.landscape.simulate` — everything
else (encoding, paired measurement, racing, confirmation and verdict) is the tuner's, so rows differ
only in how routes are proposed. Each is `tuner.study.sampler.sampler_for` for one value of
`[run] sampler` (`RunSpec().sampler` is the default), or another optimiser given a fair encoding
(`bench.landscape.external`).

GPT (`trtexec` 11.1's `fast` and `mixed` sweeps) and Olive (its multi-objective TPE) are re-enacted
with their own rules and deliver by them: each route is built and timed once through the same
simulated child, un-paired and with no quick gate (they have none), and they deliver the fastest
measurement among the routes their rules accept.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import optuna
from optuna.trial import TrialState

from bench.landscape.external import gp_sampler, smac_sampler
from bench.landscape.simulate import Simulation, Step
from bench.landscape.truth import Truth
from tuner import job as J
from tuner.space import Route, SearchSpace, route_hash
from tuner.spec import RunSpec
from tuner.study import attrs as A
from tuner.study.local_search import LocalSearchSampler
from tuner.study.sampler import NoRepeatSampler, sampler_for

TRIAL_CAP = 3  # a run stops after TRIAL_CAP x budget trials, whatever its builds
CHECKPOINTS = (10, 20, 30, 50, 100)  # builds at which the end-of-study confirmation is made


@dataclass
class Run:
    """One run of a strategy: its steps, what it delivers at each checkpoint, what its measurement cost."""

    steps: list[Step]
    confirmed: dict[int, str]  # builds -> the route delivered with that budget
    remeasures: int = 0
    seconds: float = 0.0  # virtual seconds of timed calls
    confirm_runs: dict[int, int] = field(default_factory=dict)  # builds -> processes of the confirmation behind it
    sources: list[str] = field(default_factory=list)  # studies a warm start came from


SamplerFactory = Callable[[SearchSpace, int], optuna.samplers.BaseSampler]


@dataclass(frozen=True)
class Strategy:
    """A named way to spend builds on a landscape; `candidate`: one of the samplers the default is chosen from."""

    name: str
    label: str
    sampler: SamplerFactory | None = None  # a study strategy's sampler; None: `direct` runs it
    direct: Callable[[Direct], None] | None = None
    candidate: bool = False
    drift_share: float | None = None  # overrides the scenario's
    extend_confirmation: bool = True  # False: the confirmation ends a near tie with the default at its cap

    def run(
        self,
        truth: Truth,
        budget: int,
        seed: int,
        drift_share: float,
        setup: Callable[[Simulation], None] | None = None,
    ) -> Run:
        """One run with `seed` (sampler and replayed noise) until `budget` builds."""
        with tempfile.TemporaryDirectory(prefix="search-bench-") as tmp:
            share = drift_share if self.drift_share is None else self.drift_share
            if self.sampler is not None:
                sim = Simulation(
                    truth,
                    self.sampler(truth.space, seed),
                    Path(tmp),
                    share,
                    seed,
                    extend_confirmation=self.extend_confirmation,
                )
                if setup is not None:
                    setup(sim)
                sim.run(budget, CHECKPOINTS, TRIAL_CAP * budget)
                return Run(
                    sim.steps,
                    sim.confirmed,
                    sim.remeasures,
                    sim.seconds,
                    confirm_runs=sim.confirm_runs,
                    sources=list((sim.study.user_attrs.get(A.WARM_START) or {}).get("sources", [])),
                )
            ev = Direct(
                Simulation(truth, optuna.samplers.RandomSampler(seed), Path(tmp), share, seed, recommended=False),
                budget,
            )
            assert self.direct is not None
            self.direct(ev)
            return Run(ev.steps, {}, 0, ev.sim.seconds)


def default_sampler(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """What a worker of a study with the study file's defaults gets (with `seed` in place of the per-process seed)."""
    return sampler_for(RunSpec(budget=1), seed, space)


def local(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    return sampler_for(RunSpec(budget=1, sampler="local"), seed, space)


def local_forest(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """Sampler 'local' as it was before the additive and linear models: the random forests alone."""
    return NoRepeatSampler(LocalSearchSampler(space, seed, portfolio=False), seed)


def local_previous(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """Sampler 'local' as it was before the centres' own threshold and the restart limit
    (`LocalSearchSampler(previous=True)`)."""
    return NoRepeatSampler(LocalSearchSampler(space, seed, previous=True), seed)


def tpe(startup: int) -> SamplerFactory:
    return lambda space, seed: sampler_for(RunSpec(budget=1, sampler="tpe", startup_trials=startup), seed, space)


def random_search(space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    return sampler_for(RunSpec(budget=1, sampler="random"), seed, space)


# -- GPT and Olive: routes evaluated one by one, delivered by their own rules ----------------------------


@dataclass
class Direct:
    """Routes built and timed once each through the simulated child: un-paired, every route timed and checked
    on all feeds; a repeat is answered from the cache (not a build). Delivers the fastest accurate measurement."""

    sim: Simulation
    budget: int
    steps: list[Step] = field(default_factory=list)
    seen: dict[str, J.Result] = field(default_factory=dict)
    fastest: tuple[float, str | None] = (math.inf, None)

    @property
    def space(self) -> SearchSpace:
        return self.sim.space

    @property
    def statistic(self) -> str:
        return self.sim.truth.statistic

    @property
    def done(self) -> bool:
        return self.sim.builds >= self.budget

    def __call__(self, route: Route) -> J.Result:
        key = route_hash(route)
        build = key not in self.seen and not self.space.check(route)
        if build:
            self.sim.builds += 1
            self.seen[key] = self.sim.child(
                route, self.sim.backend, f"direct-{self.sim.builds:05d}", tolerance=math.inf
            )
        result = self.seen.get(key) or J.Result(status=J.INVALID_ROUTE, message=self.space.check(route) or "")
        feasible = result.status == J.OK and result.accuracy is not None and result.accuracy <= self.sim.truth.tolerance
        value = float(result.latency[self.statistic]) if result.latency else None
        if feasible and value is not None and value < self.fastest[0]:
            self.fastest = (value, key)
        self.steps.append(Step(key, build, result.status, value, feasible, self.fastest[1]))
        return result


def gpt_fast(ev: Direct) -> set[str]:
    """The default route, then each knob active in it changed alone to each other value, in order.

    Returns the "positive" knobs by trtexec 11.1's rule: a one-off value that did not crash and was
    faster than the baseline as measured (`!crashed && gpu < baseline`; accuracy is not checked).
    """
    space = ev.space
    default = space.default_route()
    base = ev(default)
    base_v = float(base.latency[ev.statistic]) if base.latency else math.inf
    positive: set[str] = set()
    for name in default:
        for value in space.param(name).choices:
            if value == space.param(name).default or ev.done:
                continue
            r = ev(space.complete({**default, name: value}))
            if r.latency and float(r.latency[ev.statistic]) < base_v:
                positive.add(name)
    return positive


def gpt_mixed(ev: Direct) -> None:
    """`fast`, then every combination of the positive knobs (and the knobs they activate)."""
    positive = gpt_fast(ev)
    fixed = {name: [value] for name, value in ev.space.default_route().items() if name not in positive}
    for route in ev.space.restrict(fixed).routes():
        if ev.done:
            return
        if route_hash(route) not in ev.seen:
            ev(route)


class Olive:
    """Olive's OptunaSampler (olive/search/samplers/optuna_sampler.py): every knob a categorical *index*;
    a conditional knob is named after its parents' values (`name___v1 v2`) and always sampled; one
    objective per metric — latency, then accuracy (its loss), both minimised — and failures PRUNED.
    Accuracy is a goal checked afterwards (the best candidate meets it), not a constraint; a proposal
    whose index vector was already asked is left unanswered and asked again (its duplicate handling)."""

    def __init__(self, seed: int) -> None:
        self.study = optuna.create_study(
            directions=["minimize", "minimize"],
            sampler=optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed),
        )

    def suggest(self, trial: optuna.Trial, space: SearchSpace) -> Route:
        route: Route = {}
        parents = condition_parents(space)
        for p in space.params:
            name = (
                p.name if not parents[p.name] else f"{p.name}___" + " ".join(str(route.get(q)) for q in parents[p.name])
            )
            index = trial.suggest_categorical(name, list(range(len(p.choices))))
            if p.active(route):
                route[p.name] = p.choices[index]
        return route

    def tell(self, trial: optuna.Trial, result: J.Result, statistic: str) -> None:
        if result.latency:
            accuracy = (
                result.accuracy
                if result.accuracy is not None and math.isfinite(result.accuracy)
                else float(sys.maxsize)
            )
            self.study.tell(trial, [float(result.latency[statistic]), accuracy])
        else:
            self.study.tell(trial, state=TrialState.PRUNED)


def olive(ev: Direct, seed: int) -> None:
    """Olive's search until the budget is spent (no baseline trial)."""
    o = Olive(seed)
    asked: set[tuple] = set()
    for _ in range(TRIAL_CAP * ev.budget):
        if ev.done:
            return
        trial = o.study.ask()
        route = o.suggest(trial, ev.space)
        point = tuple(sorted(trial.params.items()))
        if point in asked:
            continue
        asked.add(point)
        o.tell(trial, ev(route), ev.statistic)


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


# -- the registry ----------------------------------------------------------------------------------------

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "local",
            "local search over knob groups around the confirmed incumbent, random forests and additive models "
            "(sampler 'local')",
            local,
            candidate=True,
        ),
        Strategy(
            "local-previous",
            "sampler 'local' as it was before the centres' own threshold and the restart limit (the previous default)",
            local_previous,
            candidate=True,
        ),
        Strategy(
            "local-forest",
            "sampler 'local' with the random forests alone (the default before the additive and linear models)",
            local_forest,
            candidate=True,
        ),
        Strategy(
            "tpe",
            "TPE multivariate + group + constant liar, 4 start-up trials, no-repeat step (sampler 'tpe')",
            tpe(4),
            candidate=True,
        ),
        Strategy("tpe-startup-8", "TPE as 'tpe' with 8 start-up trials", tpe(8), candidate=True),
        Strategy("random", "random search (sampler 'random')", random_search, candidate=True),
        Strategy(
            "gp-fair",
            "Optuna GPSampler on flattened knob groups, failures COMPLETE with a violated constraint",
            gp_sampler,
        ),
        Strategy(
            "smac",
            "SMAC3 hyperparameter-optimisation facade (random forest) on flattened knob groups, failures CRASHED",
            smac_sampler,
        ),
        Strategy(
            "local-drift-0",
            "sampler 'local', replayed with no between-round drift (ideal pairing)",
            local,
            drift_share=0.0,
        ),
        Strategy(
            "local-drift-1",
            "sampler 'local', replayed with all the recorded between-round drift",
            local,
            drift_share=1.0,
        ),
        Strategy(
            "local-cap",
            "sampler 'local', the end-of-study confirmation ending a near tie with the default at its cap (as before "
            "the extension)",
            local,
            extend_confirmation=False,
        ),
        Strategy(
            "olive",
            "Olive: multi-objective TPE (latency, accuracy), index encoding, failures pruned, duplicates re-asked, "
            "no baseline; delivers its best candidate (accuracy goal met, lowest measured latency)",
            direct=lambda ev: olive(ev, ev.sim.seed),
        ),
        Strategy(
            "gpt-fast",
            "GPT fast: default + one knob at a time; delivers the fastest iteration that passed accuracy",
            direct=gpt_fast,
        ),
        Strategy(
            "gpt-mixed",
            "GPT mixed: fast, then all combinations of the knobs trtexec 11.1 counts positive (did not crash and "
            "faster)",
            direct=gpt_mixed,
        ),
    )
}
DEFAULT_SET = (
    "local",
    "local-previous",
    "local-forest",
    "tpe",
    "tpe-startup-8",
    "random",
    "gp-fair",
    "smac",
    "olive",
    "gpt-fast",
    "gpt-mixed",
)
