"""Scoring a strategy's run against the landscape's truth, and summarising runs over seeds.

Two incumbents are scored after each build, both by their *true* value (median over the recorded
rounds) relative to the landscape's true best feasible value:
- *delivered* (the headline): the route the strategy would hand to its user if it stopped there, by
  its own selection rule (`Step.delivered`: ours after paired measurement and racing, GPT and Olive
  their fastest accepted measurement). A delivered route that is not truly feasible (a flaky route
  that happened to pass) counts as not delivered;
- *built*: the best route built so far that was observed feasible, as if the selection stage always
  identified it — an upper bound on what any selection could deliver.
A strategy that stops before a budget delivers what it had when it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.landscape.oracle import Oracle
from bench.landscape.strategies import Step

LEVELS = (0.02, 0.05)
BUDGETS = (10, 20, 30, 50, 100)


def ratio_curve(steps: Sequence[Step], oracle: Oracle) -> list[float]:
    """Built incumbent's true value / true best after each build (inf while nothing feasible was seen)."""
    by_key = {p.key: p for p in oracle.landscape.points}
    curve: list[float] = []
    ratio = math.inf
    for s in steps:
        if s.feasible and s.value is not None:
            true = oracle.true_value(by_key[s.key])
            ratio = min(ratio, (s.value if true is None else true) / oracle.best)
        if s.build:
            curve.append(ratio)
    return curve


def delivered_curve(steps: Sequence[Step], oracle: Oracle) -> list[float]:
    """Delivered route's true value / true best after each build (inf: nothing, or nothing truly feasible)."""
    truth = oracle.truth
    return [truth[s.delivered] / oracle.best if s.delivered in truth else math.inf for s in steps if s.build]


def _at(curve: Sequence[float], builds: int) -> float:
    return curve[min(builds, len(curve)) - 1] if curve else math.inf


def _stays_within(curve: Sequence[float], level: float, budget: int) -> int | None:
    """The first build from which the curve stays within `level` up to `budget` builds (None: never)."""
    within = [r <= 1 + level + 1e-12 for r in curve] + [bool(curve) and curve[-1] <= 1 + level + 1e-12] * max(0, budget - len(curve))
    if not within or not within[-1]:
        return None
    i = len(within)
    while i > 0 and within[i - 1]:
        i -= 1
    return i + 1


def score(steps: Sequence[Step], oracle: Oracle, budget: int) -> dict[str, Any]:
    """Delivered regret at each budget, whether it is within 2 %, builds until it stays within each
    level; the same for the best built route; the share of builds wasted."""
    built = ratio_curve(steps, oracle)
    delivered = delivered_curve(steps, oracle)
    builds = [s for s in steps if s.build]
    out: dict[str, Any] = {"builds": len(builds), "trials": len(steps)}
    for level in LEVELS:
        pct = round(level * 100)
        out[f"delivered_builds_to_{pct}pct"] = _stays_within(delivered, level, budget)
        out[f"builds_to_{pct}pct"] = next((i + 1 for i, r in enumerate(built) if r <= 1 + level + 1e-12), None)
    for b in BUDGETS:
        if b <= budget:
            out[f"delivered_regret_at_{b}"] = _at(delivered, b) - 1
            out[f"delivered_within_2pct_at_{b}"] = _at(delivered, b) <= 1.02 + 1e-12
            out[f"regret_at_{b}"] = _at(built, b) - 1
    out["wasted_fraction"] = sum(1 for s in builds if not s.feasible and not s.pruned) / len(builds) if builds else 0.0
    out["pruned_fraction"] = sum(1 for s in builds if s.pruned) / len(builds) if builds else 0.0
    out["curve"] = [round(r, 5) if math.isfinite(r) else None for r in built]
    out["delivered_curve"] = [round(r, 5) if math.isfinite(r) else None for r in delivered]
    return out


def share(values: Sequence[bool]) -> dict[str, Any]:
    """The share of runs for which a condition held."""
    return {"share": round(sum(map(bool, values)) / len(values), 5) if values else None, "n": len(values)}


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
