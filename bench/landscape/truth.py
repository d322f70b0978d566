"""A landscape's truth under one accuracy metric and tolerance: which routes are feasible, how fast each truly is.

Used to *score* a search, never to run one: a route is truly feasible when every recorded round ran
and its recorded outputs are within the tolerance on the gate feeds and on all feeds (computed with
`tuner.measure.accuracy.compare`, as the child computes them); its true latency is
`Landscape.true_ms` (the median of its rounds' levels).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tuner import job as J
from tuner.backends.replay.landscape import Landscape, Point
from tuner.backends.replay.space import replay_space
from tuner.measure.accuracy import Tolerances, compare, worst
from tuner.space import SearchSpace


@dataclass
class Truth:
    """A landscape under one accuracy metric and tolerance (the recorded study's metric when none is given)."""

    landscape: Landscape
    tolerance: float
    metric: str = ""
    statistic: str = "median"
    space: SearchSpace = field(init=False)

    def __post_init__(self) -> None:
        meta = self.landscape.meta
        self.metric = self.metric or meta["accuracy"]["metric"]
        self.space = replay_space(self.landscape)
        acc = meta["accuracy"]
        tol = Tolerances(acc["atol"], acc["rtol"])
        ref, gate = self.landscape.reference, meta["data"]["gate_samples"]
        self.accuracy: dict[str, tuple[float, float]] = {}
        for key in self.landscape.outputs:  # reduced output sets reconstructed, one at a time
            outs = self.landscape.output_set(key)
            self.accuracy[key] = (
                worst(compare(self.metric, outs[:gate], ref[:gate], tol)),
                worst(compare(self.metric, outs, ref, tol)),
            )

    def true_value(self, point: Point) -> float | None:
        """The route's true latency (ms), None if no round was timed."""
        return self.landscape.true_ms(point, self.statistic)

    def feasible(self, point: Point) -> bool:
        """Every round ran, and both the gate and the full accuracy are within the tolerance."""
        if point.outputs is None or not point.rounds or any(r.status != J.OK for r in point.rounds):
            return False
        return max(self.accuracy[point.outputs]) <= self.tolerance

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
        default = self.landscape.default_point()
        values = [v for p in points if (v := self.true_value(p)) is not None]
        failing = sum(1 for p in points if p.invalid or any(r.status != J.OK for r in p.rounds))
        best_key = min(self.truth, key=self.truth.__getitem__)
        spreads = [max(m) / min(m) for p in points if len(m := self.landscape.levels(p, self.statistic)) > 1]
        return {
            "routes": len(points),
            "feasible": len(self.truth),
            "failing": failing,
            "timed_infeasible": sum(1 for p in points if self.true_value(p) is not None and p.key not in self.truth),
            "best_ms": self.best,
            "default_ms": self.truth.get(default.key) if default else None,
            "fastest_any_ms": min(values) if values else None,
            "within_2pct": sum(1 for v in self.truth.values() if v <= 1.02 * self.best),
            "within_5pct": sum(1 for v in self.truth.values() if v <= 1.05 * self.best),
            "round_spread": float(np.median(spreads)) if spreads else 1.0,
            "paired": self.landscape.paired(),
            "best_route": next(p.route for p in points if p.key == best_key),
        }
