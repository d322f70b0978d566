"""The local search's surrogate: models over one-hot routes, learning from every outcome of a study.

Fitted on every finished trial:
- a *latency* model of the log of the trial's latency relative to the baseline's: timed trials
  (accuracy-infeasible ones too: their speed says something about their knobs), racing's refined
  value where a trial was re-measured, and trials stopped as `slow` at their last running paired
  estimate (in the value's units, as `tuner.study.outcome` reports it). A random forest captures how
  knobs interact, but it predicts averages of what it saw, never a route faster than the fastest one
  timed. With `additive`, a ridge model of per-knob effects (scikit-learn's `Ridge`) carries the
  prediction and the forest learns what it leaves over: combinations of moves that each helped are
  then predicted faster than either (GPT `mixed`'s rule, as a model), interactions still corrected by
  the forest;
- *feasibility* models, in two stages. Whether a route passes the quick accuracy gate and builds
  and runs: gate-pruned, failed and crashed routes are the negatives, every timed route (slow-pruned
  ones too) a positive. A random forest (interactions: fp16 with a fusion that fails to build),
  times, with `linear`, a logistic model of per-knob effects: a precision variant that failed the
  gate at one graph level is then expected to fail at the others, which a forest of a few dozen
  routes learns only slowly. Then whether a timed route passes the full accuracy check, learnt from
  the routes that were checked on every feed (a slow-pruned route stopped before it: `Observation.
  checked` False) by a random forest, once both outcomes were seen. Before, a slow route counted
  feasible: an fp16 variant inaccurate under a strict tolerance looked feasible whenever it was also
  slow, and drew builds.
Every model sees a sub-knob's value *within its variant* (`Encoder(nested=True)`: `per_channel = True`
of dynamic int8 is another column than that of static int8), so a failure is carried to the routes
sharing the failing variant and its sub-knob values, not to every route with the same sub-knob value
(a static int8 route failing the gate no longer condemns dynamic int8 with per-channel weights), and
a sub-knob's effect on latency is learnt for its own variant (`keep_fp32 = "none"` speeds fp16 up by
another amount than `"sensitive"` does; measured on the recorded landscapes, docs/search-efficiency.md).
Observations carried over from other studies (`tuner.study.warm_start`) join all of them with a lower
weight. A candidate's score is its expected improvement in log latency over the incumbent (the
forest's trees give the spread) times its probability of being feasible.
The models are fitted and asked on one thread (`threadpoolctl`), without touching the process's
environment: the worker's trial children inherit that, and a change to it mid-study would also
replace the worker's pre-imported child server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from tuner.space import SearchSpace
from tuner.space.params import Value

TREES = 32
RIDGE_ALPHA = 1.0  # the additive latency model's L2 penalty (scikit-learn's default)
LOGISTIC_C = 1.0  # the linear feasibility model's inverse L2 penalty (scikit-learn's default)
MIN_SPREAD = 0.02  # floor of a prediction's spread in log latency (about 2 %: the measurement's own precision)


@dataclass(frozen=True)
class Observation:
    """One route's outcome: its log latency relative to the baseline's (None if never timed), feasibility and weight.

    `checked` False: the route passed the quick accuracy gate but was never checked on every feed (its timing stopped
    as slow), so `feasible` is what the gate said; the full check's model leaves it out."""

    route: Mapping[str, Value]
    log_ratio: float | None
    feasible: bool
    weight: float = 1.0
    checked: bool = True


class Encoder:
    """Routes as one-hot vectors: one column per (knob, value), plus one per conditional knob for "absent".

    `nested`: a knob that belongs to another knob's group (`tuner.space.groups`: a precision variant's
    sub-knobs) has one column per (knob, value, value of its group's root): its effect is learnt within
    each variant, never carried from one variant to another."""

    def __init__(self, space: SearchSpace, nested: bool = False) -> None:
        from tuner.space.groups import knob_groups

        self.root = {name: g[0] for g in knob_groups(space).groups for name in g[1:]} if nested else {}
        self.columns: dict[tuple[str, Value | None, Value | None], int] = {}
        for p in space.params:
            parents = space.param(self.root[p.name]).choices if p.name in self.root else (None,)
            for v in (*p.choices, *((None,) if p.when is not None else ())):
                for parent in parents if v is not None else (None,):
                    self.columns.setdefault((p.name, v, parent), len(self.columns))
        self.conditional = [p.name for p in space.params if p.when is not None]

    def __call__(self, routes: Sequence[Mapping[str, Value]]) -> np.ndarray:
        x = np.zeros((len(routes), len(self.columns)), dtype=np.float32)
        for i, route in enumerate(routes):
            for name, value in route.items():
                j = self.columns.get((name, value, route.get(self.root[name]) if name in self.root else None))
                if j is not None:
                    x[i, j] = 1.0
            for name in self.conditional:
                if name not in route:
                    x[i, self.columns[(name, None, None)]] = 1.0
        return x


class Surrogate:
    """The models, fitted on `observations` (`additive`, `linear`: see the module docstring), routes encoded by
    `encoder`; `score` ranks candidate routes."""

    def __init__(
        self,
        encoder: Encoder,
        observations: Sequence[Observation],
        seed: int,
        additive: bool = False,
        linear: bool = False,
    ) -> None:
        import sklearn.ensemble  # noqa: F401  (loaded before the limit, so that the limit covers what it loads)
        import sklearn.linear_model  # noqa: F401

        with threadpool_limits(limits=1):
            self._fit(encoder, observations, seed, additive, linear)

    def _fit(
        self,
        encoder: Encoder,
        observations: Sequence[Observation],
        seed: int,
        additive: bool,
        linear: bool,
    ) -> None:
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
        from sklearn.linear_model import LogisticRegression, Ridge

        self.encoder = encoder
        timed = [o for o in observations if o.log_ratio is not None]
        self.latency = None
        self.additive = None
        if len(timed) >= 2:
            x, y, w = encoder([o.route for o in timed]), np.array([o.log_ratio for o in timed]), _weights(timed)
            if additive:
                self.additive = Ridge(alpha=RIDGE_ALPHA).fit(x, y, sample_weight=w)
                y = y - self.additive.predict(x)
            self.latency = RandomForestRegressor(
                n_estimators=TREES, min_samples_leaf=1, max_features=0.5, random_state=seed
            )
            self.latency.fit(x, y, sample_weight=w)
        gate = [_passed_gate(o) for o in observations]
        labels = set(gate)
        self.feasibility = None
        self.linear_feasibility = None
        if len(labels) == 2:
            x, w = encoder([o.route for o in observations]), _weights(observations)
            self.feasibility = RandomForestClassifier(
                n_estimators=TREES, min_samples_leaf=1, max_features=0.5, random_state=seed
            )
            self.feasibility.fit(x, gate, sample_weight=w)
            if linear:
                self.linear_feasibility = LogisticRegression(C=LOGISTIC_C, max_iter=1000).fit(x, gate, sample_weight=w)
        checked = [o for o in observations if o.checked and o.log_ratio is not None]
        self.accurate = None
        if len({o.feasible for o in checked}) == 2:
            self.accurate = RandomForestClassifier(
                n_estimators=TREES, min_samples_leaf=1, max_features=0.5, random_state=seed
            )
            self.accurate.fit(encoder([o.route for o in checked]), [o.feasible for o in checked], _weights(checked))
        self.all_feasible = labels == {True}

    def predict(self, routes: Sequence[Mapping[str, Value]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(mean log ratio, its spread over the trees, probability of being feasible) per route."""
        with threadpool_limits(limits=1):
            return self._predict(routes)

    def _predict(self, routes: Sequence[Mapping[str, Value]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = self.encoder(routes)
        if self.latency is None:
            mean, spread = np.zeros(len(routes)), np.ones(len(routes))
        else:
            per_tree = np.stack([t.predict(x, check_input=False) for t in self.latency.estimators_])
            if self.additive is not None:
                per_tree += self.additive.predict(x)
            mean, spread = per_tree.mean(axis=0), np.maximum(per_tree.std(axis=0), MIN_SPREAD)
        if self.feasibility is not None:
            feasible = _probability_feasible(self.feasibility, x)
            if self.linear_feasibility is not None:
                feasible = feasible * _probability_feasible(self.linear_feasibility, x)
        else:
            feasible = np.full(len(routes), 1.0 if self.all_feasible else 0.5)
        if self.accurate is not None:
            feasible = feasible * _probability_feasible(self.accurate, x)
        return mean, spread, feasible

    def score(self, routes: Sequence[Mapping[str, Value]], best: float) -> np.ndarray:
        """Expected improvement over the log ratio `best`, times the probability of being feasible."""
        mean, spread, feasible = self.predict(routes)
        z = (best - mean) / spread
        cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
        return spread * (z * cdf + pdf) * feasible


def _weights(observations: Sequence[Observation]) -> np.ndarray:
    return np.array([o.weight for o in observations])


def _passed_gate(o: Observation) -> bool:
    """Whether the route passed the quick accuracy gate and built and ran: it was timed, or it was feasible."""
    return o.feasible or o.log_ratio is not None


def _probability_feasible(model: Any, x: np.ndarray) -> np.ndarray:
    """A fitted classifier's probability of the label True."""
    return model.predict_proba(x)[:, list(model.classes_).index(True)]
