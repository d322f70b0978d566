"""Several paired measurements of one route pooled into one speedup, as a whole and (`[[objective.shapes]]`) per shape.

A measurement is one process's paired timing of a route against the default (its per-cycle log
ratios and both engines' statistic). `Pooled` keeps one route's measurements and pools them by
random effects (`tuner.measure.speedup.pooled_speedup`); `ShapePools` keeps one `Pooled` per input
shape, fed from each measurement's per-shape figures (`tuner.measure.shapes.shape_entry`), and gives
each shape's pooled row. The end-of-study confirmation (`tuner.worker.confirm`) and racing
(`tuner.study.racing`) both pool this way.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.measure.speedup import Speedup, pooled_speedup


def median_finite(values: Sequence[float]) -> float | None:
    """The median of the values that are not NaN, or None when there are none."""
    finite = [v for v in values if v == v]
    return statistics.median(finite) if finite else None


@dataclass(kw_only=True)
class Pooled:
    """Paired measurements of one route (or of one route at one input shape): one entry per uncontended process."""

    log_ratios: list[list[float]] = field(default_factory=list)  # per-cycle log(default / candidate) of each process
    latency_ms: list[float] = field(default_factory=list)  # the candidate's statistic in each process
    default_ms: list[float] = field(default_factory=list)  # the default's statistic in the same processes

    def add(self, log_ratios: Sequence[float], latency_ms: float, default_ms: float | None) -> None:
        """Keep one process's cycles and both engines' statistic."""
        self.log_ratios.append([float(d) for d in log_ratios])
        self.latency_ms.append(float(latency_ms))
        self.default_ms.append(float("nan") if default_ms is None else float(default_ms))

    def pooled(self, level: float, few: bool = True) -> Speedup | None:
        """The pooled speedup at `level` (`few`: the interval of a few processes, see `pooled_speedup`), or None
        before any process gave an interval."""
        try:
            return pooled_speedup(self.log_ratios, level, few=few)
        except ValueError:
            return None


@dataclass
class ShapePools:
    """Each input shape's measurements of one route: (inputs, weight, its `Pooled`), in the study's shape order."""

    shapes: list[tuple[dict[str, Any], float, Pooled]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.shapes)

    def add(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Keep one process's per-shape figures (`tuner.measure.shapes.shape_entry`), shape by shape."""
        if not self.shapes:
            self.shapes = [(dict(e["inputs"]), float(e["weight"]), Pooled()) for e in entries]
        for (_, _, figures), e in zip(self.shapes, entries):
            figures.add(e.get("log_ratios") or [], e["route_ms"], e.get("default_ms"))

    def rows(self, level: float, few: bool = True) -> list[dict[str, Any]]:
        """Each shape's pooled speedup and interval at `level`, both engines' median statistic (ms) and how many
        measurements were pooled."""
        rows = []
        for inputs, weight, figures in self.shapes:
            s = figures.pooled(level, few)
            rows.append(
                {
                    "inputs": inputs,
                    "weight": weight,
                    "route_ms": median_finite(figures.latency_ms),
                    "default_ms": median_finite(figures.default_ms),
                    "speedup": s.estimate if s else None,
                    "ci": [s.low, s.high] if s else None,
                    "confidence": s.confidence if s else None,
                    "measurements": len(figures.log_ratios),
                }
            )
        return rows
