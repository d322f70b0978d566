"""Scoring a strategy's run against the landscape's truth, and summarising runs over seeds.

Two incumbents are scored after each build, both by their *true* value (median over the recorded
rounds) relative to the landscape's true best feasible value:
- *found*: the best route built so far that was observed feasible, as a confirmation stage that
  re-measures the top candidates (`tuner run` does) would identify it;
- *chosen*: the feasible route with the lowest single *observed* value, what a tuner without
  confirmation (GPT, Olive) reports; a lucky measurement counts against it.
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


def ratio_curve(steps: Sequence[Step], oracle: Oracle, chosen: bool = False) -> list[float]:
    """Incumbent true value / true best after each build (inf while nothing feasible was seen)."""
    by_key = {p.key: p for p in oracle.landscape.points}
    curve: list[float] = []
    best_obs, ratio = math.inf, math.inf
    for s in steps:
        if s.feasible and s.value is not None:
            true = oracle.true_value(by_key[s.key])
            true = s.value if true is None else true
            if chosen and s.value < best_obs:
                best_obs, ratio = s.value, true / oracle.best
            elif not chosen:
                ratio = min(ratio, true / oracle.best)
        if s.build:
            curve.append(ratio)
    return curve


def score(steps: Sequence[Step], oracle: Oracle, budget: int) -> dict[str, Any]:
    """Builds to within each level and regret at each budget (found), the chosen route's regret at the
    end, and the share of builds wasted."""
    curve = ratio_curve(steps, oracle)
    chosen = ratio_curve(steps, oracle, chosen=True)
    builds = [s for s in steps if s.build]
    out: dict[str, Any] = {"builds": len(builds), "trials": len(steps)}
    for level in LEVELS:
        hit = next((i + 1 for i, r in enumerate(curve) if r <= 1 + level + 1e-12), None)
        out[f"builds_to_{round(level * 100)}pct"] = hit
    for b in BUDGETS:
        if b <= budget:
            r = curve[min(b, len(curve)) - 1] if curve else math.inf
            out[f"regret_at_{b}"] = r - 1
    out["chosen_regret_at_end"] = chosen[-1] - 1 if chosen else math.inf
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
