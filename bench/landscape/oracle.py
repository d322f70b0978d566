"""Answer routes from a landscape in-process, exactly as a trial's child would, but in microseconds.

The decision sequence mirrors `tuner.worker.child`: a recorded round is drawn at random; a failed
round is that failure; otherwise the quick accuracy gate on the first `gate` feeds, a timing run (a
bootstrap resample of the round's recorded samples, summarised by `tuner.measure.timing.summarize`)
and the accuracy on all feeds. Accuracies are computed with `tuner.measure.accuracy.compare` from the
recorded outputs against the recorded reference, so any metric and tolerance can be replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tuner.backends.replay.landscape import Landscape, Point
from tuner.backends.replay.space import replay_space
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.measure.timing import summarize
from tuner.space import Route, SearchSpace
from tuner import job as J


@dataclass
class Oracle:
    """A landscape under one accuracy metric and tolerance."""

    landscape: Landscape
    tolerance: float
    metric: str = ""
    statistic: str = "median"
    gate: int = 0
    space: SearchSpace = field(init=False)

    def __post_init__(self) -> None:
        meta = self.landscape.meta
        self.metric = self.metric or meta["accuracy"]["metric"]
        self.gate = self.gate or meta["data"]["gate_samples"]
        self.space = replay_space(self.landscape)
        acc = meta["accuracy"]
        tol = Tolerances(acc["atol"], acc["rtol"])
        ref = self.landscape.reference
        self._acc: dict[str, tuple[float, float]] = {}
        for key, outs in self.landscape.outputs.items():
            self._acc[key] = (worst(compare(self.metric, outs[: self.gate], ref[: self.gate], tol)), worst(compare(self.metric, outs, ref, tol)))

    # -- answering one route -------------------------------------------------------------------

    def evaluate(self, route: Route, rng: np.random.Generator, gate: bool = True) -> J.Result:
        """One trial's result for `route` (noise drawn from `rng`); `gate=False` times every route that runs."""
        point = self.landscape.point(route)
        if point is None:
            return J.Result(status=J.BUILD_ERROR, message="route not in the landscape", phase="build")
        if point.invalid:
            return J.Result(status=J.INVALID_ROUTE, message=point.invalid)
        rnd = point.rounds[int(rng.integers(len(point.rounds)))]
        if rnd.status != J.OK:
            return J.Result(status=rnd.status, message=rnd.message, phase=rnd.phase)
        gate_acc, full_acc = self._acc[point.outputs or ""]
        if gate and gate_acc > self.tolerance:
            return J.Result(status=J.GATE_FAILED, accuracy=gate_acc, phase="gate")
        samples = np.asarray(rnd.samples_ms)
        latency = summarize(rng.choice(samples, size=samples.size, replace=True)).to_dict()
        status = J.OK if full_acc <= self.tolerance else J.ACCURACY
        return J.Result(status=status, accuracy=full_acc, latency=latency, phase="accuracy")

    # -- the truth, for scoring ------------------------------------------------------------------

    def true_value(self, point: Point) -> float | None:
        """The median over the timed rounds of each round's statistic; None if no round was timed."""
        timed = [summarize(r.samples_ms).get(self.statistic) for r in point.rounds if r.status == J.OK and r.timed]
        return float(np.median(timed)) if timed else None

    def feasible(self, point: Point) -> bool:
        """Every round timed and both the gate and the full accuracy within the tolerance."""
        if point.outputs is None or not point.rounds or any(r.status != J.OK for r in point.rounds):
            return False
        return max(self._acc[point.outputs]) <= self.tolerance

    @cached_property
    def truth(self) -> dict[str, float]:
        """True value of every feasible route, by route key."""
        return {p.key: v for p in self.landscape.points if self.feasible(p) and (v := self.true_value(p)) is not None}

    @cached_property
    def best(self) -> float:
        """The landscape's true best feasible value."""
        return min(self.truth.values())

    def describe(self) -> dict[str, Any]:
        """Facts about the landscape under this tolerance (for the report)."""
        points = self.landscape.points
        default = self.landscape.point(self.space.default_route())
        values = [v for p in points if (v := self.true_value(p)) is not None]
        failing = sum(1 for p in points if p.invalid or any(r.status != J.OK for r in p.rounds))
        best_key = min(self.truth, key=self.truth.__getitem__)
        spreads = [max(m) / min(m) for p in points if len(m := [float(np.median(r.samples_ms)) for r in p.rounds if r.timed]) > 1]
        return {
            "routes": len(points), "feasible": len(self.truth), "failing": failing,
            "timed_infeasible": sum(1 for p in points if self.true_value(p) is not None and p.key not in self.truth),
            "best_ms": self.best, "default_ms": self.truth.get(default.key) if default else None,
            "fastest_any_ms": min(values) if values else None,
            "within_2pct": sum(1 for v in self.truth.values() if v <= 1.02 * self.best),
            "within_5pct": sum(1 for v in self.truth.values() if v <= 1.05 * self.best),
            "round_spread": float(np.median(spreads)) if spreads else 1.0,
            "best_route": next(p.route for p in points if p.key == best_key),
        }
