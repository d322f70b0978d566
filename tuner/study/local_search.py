"""The default sampler: a local search around the confirmed incumbent, over knob groups, ranked by a surrogate.

On the recorded landscapes the best route is two or three improving moves from the default when a
move changes one knob *group* (a precision variant with its sub-knobs, a fusion with its switches:
`tuner.space.groups`), and knobs interact, so a model of per-knob effects ranks the best route only
somewhere in its top 20. So each proposal:

1. takes the *centres*: the study's best confirmed route (`tuner.study.racing.best_confirmed`) and
   every route racing cannot tell apart from it (their intervals overlap), else its best feasible
   trial, else the default route. A near tie is often a different basin (an fp32 route without the
   fusion against one with it), and the move that wins may start from either;
2. collects the routes not yet tried (finished, running or waiting) within `radius + REACH` group
   moves of them, the radius starting at 1 and widening while the nearest ring is used up (so the
   surrogate may pick a combination of two moves it learnt are good before every single move was tried);
3. ranks them by the surrogate (`tuner.study.surrogate`: models fitted on every outcome — timed,
   slow, infeasible, failed — plus any observations carried over from other studies): expected
   improvement on the study's best times the probability of being feasible. Proposals alternate
   between two latency models: a random forest (knobs that interact) on even trial numbers, a
   ridge model of per-knob effects with the forest on what it leaves over on odd ones (it predicts
   that moves which each helped help together, which a forest never predicts). Neither alone
   does well everywhere on the recorded landscapes: the additive one finds Silero VAD's best int8
   variant (two sub-knobs that each help) in every seed and gets stuck in MiniLM's fusion basin, the
   forest the other way round;
4. *restarts* when no candidate around the centres is worth a build (its score below `CENTRE_WORTH`, a
   quarter of the measurement's own precision): the local search's basin is spent, and the best route
   may lie beyond a valley (two moves, each worse on its own). The nearest untried ring
   (`RESTART_REACH`) of the next feasible route in order of its value, at most `RESTART_WITHIN` times
   the best's latency, is then ranked by improvement on *that* route's value, and so on; the first
   whose best candidate is worth a build (`WORTH`, the measurement's precision) gives the proposal,
   else the centres' best candidate does. A restart's improvement is counted from a slower route than
   the centres' one, so it looks larger: with one threshold for both (`WORTH`), restarts around routes
   two to four times slower than the best took the builds of the untried one-move neighbours of the
   best routes (MiniLM-strict: fp16 with nothing kept in fp32 next to the route with graph optimisation
   off, ranked first around the centres at a score of 0.005-0.01, never built).
   Before the surrogate has anything to learn from, a random candidate of the centres' neighbourhood.

Proposals of parallel workers do not collide: routes of running and waiting trials count as tried,
and a worker re-reads them just before proposing, taking the next candidate when another worker has
just taken its first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.space import Route, SearchSpace, canonical_route
from tuner.space.groups import NEIGHBOURS_MAX, knob_groups
from tuner.study import attrs as A
from tuner.study import racing
from tuner.study.outcome import is_feasible
from tuner.study.surrogate import MIN_SPREAD, Encoder, Observation, Surrogate

PENDING = (TrialState.RUNNING, TrialState.WAITING)
REACH = (
    1  # candidates also one group move beyond the nearest ring with an untried route (measured: MiniLM-strict, 4 of 6
)
# seeds built the best route within 60 trials, against 2 of 6 with the nearest ring alone)
RESTART_REACH = 0  # a restart probes its route's own nearest ring (20 seeds, delivered within 2 % at 30 builds:
# MiniLM-strict 17, MiniLM 16, against 16 and 14 with REACH)
RINGS_KEPT = 64  # neighbourhoods (centre, radius) a sampler keeps (`LocalSearchSampler.around`)
WORTH = MIN_SPREAD  # a restart's candidate is worth a build when expected to improve by the measurement's precision
CENTRE_WORTH = WORTH / 4  # a candidate around the centres at a quarter of that (docs/search-efficiency.md)
RESTART_WITHIN = 2.0  # restarts only from routes at most this many times the best's latency (the same)


class LocalSearchSampler(optuna.samplers.BaseSampler):
    """Local search over knob groups of `space`, ranked by the surrogate (see the module docstring)."""

    def __init__(
        self, space: SearchSpace, seed: int | None = None, portfolio: bool = True, previous: bool = False
    ) -> None:
        """`portfolio` False: the forests alone (the sampler as it was before the additive and linear models).
        `previous` True: the sampler as it was before the centres' own threshold and the restart limit (`WORTH` for
        every neighbourhood, restarts from every feasible route; the benchmark's comparison row)."""
        self.space = space
        self.portfolio = portfolio
        self.groups = knob_groups(space)
        self.encoder = Encoder(space, nested=True)
        self.centre_worth = WORTH if previous else CENTRE_WORTH
        self.restart_within = math.inf if previous else RESTART_WITHIN
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self._rings: dict[tuple[Any, int], list[tuple[Any, Route]]] = {}  # (centre, radius) -> keyed routes: `around`

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {p.name: CategoricalDistribution(list(p.choices)) for p in self.space.params if len(p.choices) > 1}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        trials = study.get_trials(deepcopy=False)
        tried = {
            canonical_route(_route(t))
            for t in trials
            if t.number != trial.number and (t.state.is_finished() or t.state in PENDING)
        }
        observations = self.observations(trials, study)
        model = self.surrogate(observations, additive=self.portfolio and trial.number % 2 == 1)
        neighbourhoods = (
            (candidates, self.score(model, candidates, reference), self.centre_worth if i == 0 else WORTH)
            for i, (centres, reference) in enumerate(self.starts(trials, study, observations))
            if (candidates := self.neighbourhood(centres, tried, REACH if i == 0 else RESTART_REACH))
        )
        candidates, scores = first_worth_building(neighbourhoods, model is not None)
        if not candidates:
            return {}  # every route was tried: the no-repeat step or the sampler's independent draws take over
        order = list(np.argsort(-scores))
        taken = {
            canonical_route(_route(t))
            for t in study.get_trials(deepcopy=False, states=PENDING)
            if t.number != trial.number
        }
        pick = next((candidates[i] for i in order if canonical_route(candidates[i]) not in taken), candidates[order[0]])
        return {k: v for k, v in pick.items() if k in search_space}

    def centres(self, trials: Sequence[FrozenTrial], study: optuna.Study) -> list[Route]:
        """The routes the neighbourhood is taken around: the best confirmed and every route whose racing interval
        overlaps its own, else the best feasible, else the default."""
        raced = racing.races(study)
        best = racing.best_confirmed(trials, raced)
        if best is None:
            feasible = [t for t in trials if is_feasible(t)]
            best = min(feasible, key=lambda t: (t.value, t.number)) if feasible else None
            return [_route(best) if best is not None else self.space.default_route()]
        ranked = racing.standings(trials, raced)
        lead = next(s for s in ranked if s.number == best.number)
        by_number = {t.number: t for t in trials}
        return [_route(best)] + [
            _route(by_number[s.number]) for s in ranked if s.number != lead.number and racing.overlap(s, lead)
        ]

    def starts(
        self, trials: Sequence[FrozenTrial], study: optuna.Study, observations: Sequence[Observation]
    ) -> Iterator[tuple[list[Route], float]]:
        """Where a proposal may start, in order, each with the log ratio its candidates must improve on: the centres
        with the study's best, then (restarts) every other feasible route of the study's own at most RESTART_WITHIN
        times the best's latency, fastest first, with its own."""
        own = sorted(
            (o for o in observations if o.feasible and o.log_ratio is not None and o.weight >= 1.0),
            key=lambda o: o.log_ratio,
        )
        centres = self.centres(trials, study)
        yield centres, own[0].log_ratio if own else 0.0
        done = {canonical_route(c) for c in centres}
        for o in own:
            if o.log_ratio - own[0].log_ratio > math.log(self.restart_within):
                return
            if (key := canonical_route(o.route)) not in done:
                done.add(key)
                yield [dict(o.route)], float(o.log_ratio)

    def neighbourhood(self, centres: Sequence[Route], tried: set[Any], reach: int = REACH) -> list[Route]:
        """The untried routes within the nearest ring (around any of `centres`) holding one, plus `reach` rings;
        at most NEIGHBOURS_MAX of them, drawn at random when the centres' neighbourhoods hold more."""
        for radius in range(1, len(self.groups.groups) + 1):
            seen, found = set(tried), []
            for centre in centres:
                for key, r in self.around(centre, radius + reach):
                    if key not in seen:
                        seen.add(key)
                        found.append(r)
            if len(found) > NEIGHBOURS_MAX:
                return [found[i] for i in sorted(self.rng.choice(len(found), NEIGHBOURS_MAX, replace=False))]
            if found:
                return found
        return []

    def around(self, centre: Route, radius: int) -> list[tuple[Any, Route]]:
        """The routes within `radius` group moves of `centre` (`Groups.within`) with their canonical keys, kept.

        A large space's neighbourhood is collected move by move (about a second for a real study's space
        on one core), and the centres change seldom from one proposal to the next, so each is collected
        once: later proposals around the same centre filter the same routes by what has been tried since.
        """
        key = (canonical_route(centre), radius)
        if key not in self._rings:
            if len(self._rings) >= RINGS_KEPT:
                self._rings.pop(next(iter(self._rings)))  # the oldest
            self._rings[key] = [(canonical_route(r), r) for r in self.groups.within(centre, radius, self.rng)]
        return self._rings[key]

    def surrogate(self, observations: Sequence[Observation], additive: bool = False) -> Surrogate | None:
        """The surrogate fitted on `observations` (with the additive latency model or without); None while none of
        them was timed (nothing to learn from)."""
        if not any(o.log_ratio is not None for o in observations):
            return None
        return Surrogate(
            self.encoder,
            observations,
            int(self.rng.integers(2**31)),
            additive,
            linear=self.portfolio,
        )

    def score(self, model: Surrogate | None, candidates: list[Route], reference: float) -> np.ndarray:
        """Each candidate's expected improvement on `reference` times its probability of being feasible (random
        while there is no model); ties broken at random."""
        noise = self.rng.random(len(candidates)) * 1e-9
        return noise if model is None else model.score(candidates, reference) + noise

    def observations(self, trials: Sequence[FrozenTrial], study: optuna.Study) -> list[Observation]:
        """Every finished trial's outcome (relative to the baseline's value), then those carried over from other
        studies."""
        base = racing.baseline_trial(trials)
        scale = float(base.value) if base is not None and base.value else None
        raced = racing.races(study)
        out = [o for t in trials if (o := observation(t, raced, scale)) is not None]
        carried = (study.user_attrs.get(A.WARM_START) or {}).get("observations") or []
        weight = carried_weight(len(out))
        out += [
            Observation(dict(c["route"]), c.get("log_ratio"), bool(c["feasible"]), weight)
            for c in carried
            if self.space.contains(c["route"])
        ]
        return out

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        """A knob the relative proposal lacks: its default (the space's other knobs follow the proposal)."""
        default = self.space.param(param_name).default if param_name in self.space.names() else None
        choices = getattr(param_distribution, "choices", ())
        return default if default in choices else choices[int(self.rng.integers(len(choices)))]

    def reseed_rng(self) -> None:
        self.rng = np.random.default_rng()


def first_worth_building(
    neighbourhoods: Iterable[tuple[list[Route], np.ndarray, float]], learnt: bool = True
) -> tuple[list[Route], np.ndarray]:
    """The first (candidates, scores) whose best score reaches its threshold (the third of each triple), else the
    first one (empty when there is none).

    Without a model (`learnt` False) the scores mean nothing, and the first is taken as it is."""
    first: tuple[list[Route], np.ndarray] | None = None
    for candidates, scores, worth in neighbourhoods:
        if not learnt or scores.max() >= worth:
            return candidates, scores
        first = first or (candidates, scores)
    return first or ([], np.zeros(0))


def observation(
    t: FrozenTrial,
    raced: Mapping[str, Mapping[str, Any]],
    scale: float | None,
    state: TrialState | None = None,
    value: float | None = None,
) -> Observation | None:
    """What a finished trial says: its log latency relative to `scale` (racing's refined value where it was
    re-measured; a slow trial's last running estimate) and whether it was feasible; None for FAIL and unfinished.

    `state` and `value` stand for the trial's while it is being told (a sampler's `after_trial`)."""
    state = state or t.state
    if state == TrialState.COMPLETE:
        value = racing.refined_value(t, raced, value)
        feasible = bool(t.constraints) and all(v <= 0 for v in t.constraints.values())
        return Observation(_route(t), _log_ratio(value, scale), feasible)
    if state == TrialState.PRUNED:
        slow = t.user_attrs.get(A.FAILURE_CLASS) == "slow"
        last = t.intermediate_values[max(t.intermediate_values)] if slow and t.intermediate_values else None
        return Observation(_route(t), _log_ratio(last, scale), slow, checked=not slow)
    return None


def carried_weight(own: int) -> float:
    """The weight of an observation carried over from another study: it fades as the study's own ones accumulate."""
    return 0.5 / (1.0 + own / 10.0)


def _log_ratio(value: float | None, scale: float | None) -> float | None:
    if value is None or not scale or not math.isfinite(value) or value <= 0:
        return None
    return math.log(value / scale)


def _route(t: FrozenTrial) -> Route:
    """A trial's route: its parameters, or the route it was enqueued with."""
    return dict(t.params) or dict(t.system_attrs.get("fixed_params", {}))
