"""How a study judges an engine's outputs against the fp32 reference: its `[accuracy]` section.

The study-wide metric (a built-in one, per output, or the study's own function, `tuner.measure.user_metric`, once
over all outputs) applies to every output without an `[accuracy.outputs.NAME]` section; an output with one is judged
by its own built-in metric and tolerance. Every value is "lower is better".

The worst entry decides, each relative to its own tolerance: an output judged against tolerance t_o counts as
value * T / t_o, T the study-wide tolerance, so the study's accuracy value stays comparable with T and is at most T
exactly when every output is within its own tolerance (outputs without a section count as they are).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.measure.accuracy import METRICS, Outputs, Tolerances, compare, stack
from tuner.measure.user_metric import MetricError, MetricFn, evaluate, is_plugin, load_metric

PER_FEED = ("max_abs", "cosine")  # metrics whose value is one feed's: a failure names that feed


@dataclass(frozen=True)
class Rule:
    """One output's own built-in metric and tolerance (`[accuracy.outputs.NAME]`)."""

    metric: str
    tolerance: float
    tol: Tolerances = Tolerances()

    def plain(self) -> dict[str, Any]:
        """As stored in a job, a cache key and a fingerprint."""
        return {"metric": self.metric, "tolerance": self.tolerance, "atol": self.tol.atol, "rtol": self.tol.rtol}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> Rule:
        """The inverse of `plain`."""
        return cls(str(d["metric"]), float(d["tolerance"]), Tolerances(float(d["atol"]), float(d["rtol"])))


@dataclass
class Judge:
    """The study-wide metric, tolerance and atol/rtol, and the outputs with their own rule."""

    metric: str
    tolerance: float
    tol: Tolerances = Tolerances()
    outputs: dict[str, Rule] = field(default_factory=dict)
    _fn: MetricFn | None = None

    def values(self, outputs: Sequence[Outputs], reference: Sequence[Outputs]) -> dict[str, float]:
        """Each output's metric value over the feeds given; a study function's value under the metric's name."""
        own = {name: rule for name, rule in self.outputs.items() if name in reference[0]}
        result: dict[str, float] = {}
        if is_plugin(self.metric):
            if self._fn is None:
                try:
                    self._fn = load_metric(self.metric)
                except ValueError as exc:
                    raise MetricError(f"accuracy.metric: {exc}") from exc
            result[self.metric] = evaluate(self.metric, self._fn, outputs, reference)
        else:
            result.update(compare(self.metric, outputs, reference, self.tol))
        for name, rule in own.items():
            result[name] = compare(rule.metric, outputs, [{name: r[name]} for r in reference], rule.tol)[name]
        return result

    def scaled(self, key: str, value: float) -> float:
        """`value` of entry `key` relative to the study-wide tolerance (see the module's docstring)."""
        rule = self.outputs.get(key)
        if rule is None or rule.tolerance == self.tolerance or math.isinf(value):
            return value
        if rule.tolerance == 0:
            return 0.0 if value == 0 else math.inf
        return value * self.tolerance / rule.tolerance

    def worst(self, values: Mapping[str, float]) -> float:
        """The study's accuracy value: the worst entry, relative to its tolerance; compared with `tolerance`."""
        return max((self.scaled(k, v) for k, v in values.items()), default=0.0)

    def breach(
        self, values: Mapping[str, float], outputs: Sequence[Outputs], reference: Sequence[Outputs]
    ) -> str | None:
        """What broke the tolerance, in words (the output, the metric, its value and tolerance, and for a metric
        of one feed, the feed), or None when nothing did."""
        if not values:
            return None
        key = max(values, key=lambda k: self.scaled(k, values[k]))
        if self.scaled(key, values[key]) <= self.tolerance:
            return None
        if key == self.metric and is_plugin(self.metric):
            return f"{self.metric}={values[key]:.4g} > {self.tolerance:g}"
        rule = self.outputs.get(key, Rule(self.metric, self.tolerance, self.tol))
        text = f"output {key}: {rule.metric}={values[key]:.4g} > {rule.tolerance:g}"
        feed = _worst_feed(rule, key, outputs, reference) if len(outputs) > 1 else None
        return text if feed is None else f"{text} (worst at feed {feed})"


def _worst_feed(rule: Rule, name: str, outputs: Sequence[Outputs], reference: Sequence[Outputs]) -> int | None:
    """The feed holding a per-feed metric's worst value for output `name` (None for other metrics)."""
    if rule.metric not in PER_FEED:
        return None
    fn = METRICS[rule.metric]

    def one(i: int) -> float:
        got = outputs[i].get(name)
        if got is None:
            return math.inf
        a, r = stack([{name: got}])[name], stack([{name: reference[i][name]}])[name]
        return fn(a, r, rule.tol) if a.shape == r.shape and np.all(np.isfinite(a)) else math.inf

    return max(range(len(outputs)), key=one)


def judge_of(metric: str, tolerance: float, atol: float, rtol: float, outputs: Mapping[str, Any]) -> Judge:
    """The judge of a job's accuracy fields (`outputs`: {name: Rule.plain()})."""
    return Judge(metric, tolerance, Tolerances(atol, rtol), {k: Rule.from_plain(v) for k, v in outputs.items()})
