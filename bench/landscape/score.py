"""Scoring a strategy's run against the landscape's truth, and summarising runs over seeds.

The incumbent after each build is what the tuner would report: the feasible evaluation with the
lowest *observed* value. It is scored by its *true* value (median over recorded rounds) relative to
the landscape's true best feasible value, so picking a route because of a lucky measurement counts
against the strategy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.landscape.oracle import Oracle
from bench.landscape.strategies import Step

LEVELS = (0.02, 0.05)
BUDGETS = (25, 50, 100)


def ratio_curve(steps: Sequence[Step], oracle: Oracle) -> list[float]:
    """Incumbent true value / true best after each build (inf while nothing feasible was seen)."""
    by_key = {p.key: p for p in oracle.landscape.points}
    curve: list[float] = []
    best_obs, ratio = math.inf, math.inf
    for s in steps:
        if s.feasible and s.value is not None and s.value < best_obs:
            best_obs = s.value
            true = oracle.true_value(by_key[s.key])
            ratio = (true if true is not None else s.value) / oracle.best
        if s.build:
            curve.append(ratio)
    return curve


def score(steps: Sequence[Step], oracle: Oracle, budget: int) -> dict[str, Any]:
    """Builds to within each level, regret at each budget, and the share of builds wasted."""
    curve = ratio_curve(steps, oracle)
    builds = [s for s in steps if s.build]
    out: dict[str, Any] = {"builds": len(builds), "trials": len(steps)}
    for level in LEVELS:
        hit = next((i + 1 for i, r in enumerate(curve) if r <= 1 + level + 1e-12), None)
        out[f"builds_to_{round(level * 100)}pct"] = hit
    for b in BUDGETS:
        if b <= budget:
            r = curve[min(b, len(curve)) - 1] if curve else math.inf
            out[f"regret_at_{b}"] = r - 1
    out["wasted_fraction"] = sum(1 for s in builds if not s.feasible) / len(builds) if builds else 0.0
    out["curve"] = [round(r, 5) if math.isfinite(r) else None for r in curve]
    return out


def summarise(values: Sequence[float | None]) -> dict[str, Any]:
    """Median and inter-quartile range over seeds; None (not reached) counts as infinitely bad.

    With unreached runs present, quantiles are taken at the nearest run rather than interpolated.
    """
    a = np.array([math.inf if v is None else v for v in values], dtype=float)
    method = "linear" if np.all(np.isfinite(a)) else "nearest"
    q25, q50, q75 = (float(np.percentile(a, q, method=method)) for q in (25, 50, 75))
    return {"median": _num(q50), "q25": _num(q25), "q75": _num(q75), "n": len(a),
            "reached": int(np.sum(np.isfinite(a)))}


def _num(v: float) -> float | None:
    return round(v, 5) if math.isfinite(v) else None
