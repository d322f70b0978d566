"""The local search's surrogate: random forests over one-hot routes, learning from every outcome of a study.

Two forests (scikit-learn), fitted on every finished trial:
- a *latency* forest on the log of the trial's latency relative to the baseline's: timed trials
  (accuracy-infeasible ones too: their speed says something about their knobs), racing's refined
  value where a trial was re-measured, and trials stopped as `slow` at their last running paired
  estimate (in the value's units, as `tuner.study.outcome` reports it);
- a *feasibility* forest on whether the route was feasible: accuracy-infeasible, gate-pruned, failed
  and crashed routes are the negatives; slow-pruned routes passed the gate and count as feasible.
Observations carried over from other studies (`tuner.study.warm_start`) join both with a lower weight.
A candidate's score is its expected improvement in log latency over the incumbent (the forest's trees
give the spread) times its probability of being feasible.
The forests are fitted and asked on one thread (`threadpoolctl`), without touching the process's
environment: the worker's trial children inherit that, and a change to it mid-study would also
replace the worker's pre-imported child server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from tuner.space import SearchSpace
from tuner.space.params import Value

TREES = 32
MIN_SPREAD = 0.02  # floor of a prediction's spread in log latency (about 2 %: the measurement's own precision)


@dataclass(frozen=True)
class Observation:
    """One route's outcome: its log latency relative to the baseline's (None if never timed), feasibility and weight."""

    route: Mapping[str, Value]
    log_ratio: float | None
    feasible: bool
    weight: float = 1.0


class Encoder:
    """Routes as one-hot vectors: one column per (knob, value), plus one per conditional knob for "absent"."""

    def __init__(self, space: SearchSpace) -> None:
        self.columns: dict[tuple[str, Value | None], int] = {}
        for p in space.params:
            for v in (*p.choices, *((None,) if p.when is not None else ())):
                self.columns.setdefault((p.name, v), len(self.columns))
        self.conditional = [p.name for p in space.params if p.when is not None]

    def __call__(self, routes: Sequence[Mapping[str, Value]]) -> np.ndarray:
        x = np.zeros((len(routes), len(self.columns)), dtype=np.float32)
        for i, route in enumerate(routes):
            for name, value in route.items():
                j = self.columns.get((name, value))
                if j is not None:
                    x[i, j] = 1.0
            for name in self.conditional:
                if name not in route:
                    x[i, self.columns[(name, None)]] = 1.0
        return x


class Surrogate:
    """The two forests, fitted on `observations`; `score` ranks candidate routes."""

    def __init__(self, encoder: Encoder, observations: Sequence[Observation], seed: int) -> None:
        import sklearn.ensemble  # noqa: F401  (loaded before the limit, so that the limit covers what it loads)

        with threadpool_limits(limits=1):
            self._fit(encoder, observations, seed)

    def _fit(self, encoder: Encoder, observations: Sequence[Observation], seed: int) -> None:
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

        self.encoder = encoder
        timed = [o for o in observations if o.log_ratio is not None]
        self.latency = None
        if len(timed) >= 2:
            self.latency = RandomForestRegressor(
                n_estimators=TREES, min_samples_leaf=1, max_features=0.5, random_state=seed
            )
            self.latency.fit(
                encoder([o.route for o in timed]), [o.log_ratio for o in timed], sample_weight=[o.weight for o in timed]
            )
        labels = {o.feasible for o in observations}
        self.feasibility = None
        if len(labels) == 2:
            self.feasibility = RandomForestClassifier(
                n_estimators=TREES, min_samples_leaf=1, max_features=0.5, random_state=seed
            )
            self.feasibility.fit(
                encoder([o.route for o in observations]),
                [o.feasible for o in observations],
                sample_weight=[o.weight for o in observations],
            )
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
            mean, spread = per_tree.mean(axis=0), np.maximum(per_tree.std(axis=0), MIN_SPREAD)
        if self.feasibility is not None:
            feasible = self.feasibility.predict_proba(x)[:, list(self.feasibility.classes_).index(True)]
        else:
            feasible = np.full(len(routes), 1.0 if self.all_feasible else 0.5)
        return mean, spread, feasible

    def score(self, routes: Sequence[Mapping[str, Value]], best: float) -> np.ndarray:
        """Expected improvement over the log ratio `best`, times the probability of being feasible."""
        mean, spread, feasible = self.predict(routes)
        z = (best - mean) / spread
        cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
        pdf = np.exp(-0.5 * z**2) / math.sqrt(2.0 * math.pi)
        return spread * (z * cdf + pdf) * feasible
