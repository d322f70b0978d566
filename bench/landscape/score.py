"""Scoring a strategy's run against the landscape's truth, and summarising runs over seeds.

Routes are scored by their *true* latency (`bench.landscape.truth`) relative to the true best
feasible one; a delivered route that is not truly feasible counts as nothing delivered (inf):
- *delivered at B builds* (the headline): what the study delivers when its budget is B builds —
  for the tuner's study the end-of-study confirmation's verdict (`Simulation.delivered`), for GPT and
  Olive their fastest accepted measurement;
- *delivered after each build*: the same without the final confirmation (racing's confirmed best);
  "builds to 2 %" is the first build from which it stays within 2 % to the end of the budget;
- *built*: the best route built so far that was observed feasible (an upper bound on any selection).
A run that stops before a budget delivers what it had when it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.landscape.simulate import Step
from bench.landscape.strategies import CHECKPOINTS, Run
from bench.landscape.truth import Truth

LEVELS = (0.02, 0.05)


def built_curve(steps: Sequence[Step], truth: Truth) -> list[float]:
    """The best built route's true value / true best after each build (inf while nothing feasible was seen)."""
    by_key = {p.key: p for p in truth.landscape.points}
    curve: list[float] = []
    ratio = math.inf
    for s in steps:
        if s.feasible and s.value is not None and s.key in by_key:
            true = truth.true_value(by_key[s.key])
            ratio = min(ratio, (s.value if true is None else true) / truth.best)
        if s.build:
            curve.append(ratio)
    return curve


def ratio(key: str | None, truth: Truth) -> float:
    """A delivered route's true value / true best (inf: nothing, or nothing truly feasible)."""
    return truth.truth[key] / truth.best if key in truth.truth else math.inf


def delivered_curve(steps: Sequence[Step], truth: Truth) -> list[float]:
    """The delivered route's ratio after each build."""
    return [ratio(s.delivered, truth) for s in steps if s.build]


def _at(curve: Sequence[float], builds: int) -> float:
    return curve[min(builds, len(curve)) - 1] if curve else math.inf


def _confirmed_at(run: Run, curve: Sequence[float], builds: int, truth: Truth) -> float:
    if not run.confirmed:
        return _at(curve, builds)
    done = [b for b in run.confirmed if b <= builds]
    return ratio(run.confirmed[max(done)], truth) if done else math.inf


def _confirm_runs_at(run: Run, builds: int) -> int | None:
    """The processes of the confirmation behind the route delivered at `builds` (None without one)."""
    done = [b for b in run.confirm_runs if b <= builds]
    return run.confirm_runs[max(done)] if done else None


def _stays_within(curve: Sequence[float], level: float, budget: int) -> int | None:
    """The first build from which the curve stays within `level` up to `budget` builds (None: never)."""
    within = [r <= 1 + level + 1e-12 for r in curve] + [bool(curve) and curve[-1] <= 1 + level + 1e-12] * max(
        0, budget - len(curve)
    )
    if not within or not within[-1]:
        return None
    i = len(within)
    while i > 0 and within[i - 1]:
        i -= 1
    return i + 1


def score(run: Run, truth: Truth, budget: int) -> dict[str, Any]:
    """Delivered regret at each checkpoint and whether it is within 2 %; builds until the delivered route stays
    within each level; the same for the best built route; the shares of builds wasted and pruned."""
    steps = run.steps
    built = built_curve(steps, truth)
    delivered = delivered_curve(steps, truth)
    builds = [s for s in steps if s.build]
    out: dict[str, Any] = {"builds": len(builds), "trials": len(steps), "remeasures": run.remeasures}
    for level in LEVELS:
        pct = round(level * 100)
        out[f"delivered_builds_to_{pct}pct"] = _stays_within(delivered, level, budget)
        out[f"builds_to_{pct}pct"] = next((i + 1 for i, r in enumerate(built) if r <= 1 + level + 1e-12), None)
    for b in CHECKPOINTS:
        if b <= budget:
            at = _confirmed_at(run, delivered, b, truth)
            out[f"delivered_regret_at_{b}"] = at - 1
            out[f"delivered_within_2pct_at_{b}"] = at <= 1.02 + 1e-12
            out[f"regret_at_{b}"] = _at(built, b) - 1
            if run.confirm_runs:
                out[f"confirm_processes_at_{b}"] = _confirm_runs_at(run, b)
    out["wasted_fraction"] = sum(1 for s in builds if not s.feasible and not s.pruned) / len(builds) if builds else 0.0
    out["pruned_fraction"] = sum(1 for s in builds if s.pruned) / len(builds) if builds else 0.0
    timed = sum(1 for s in builds if s.value is not None or s.pruned)
    out["timing_s_per_timed_trial"] = round(run.seconds / max(timed, 1), 3)
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
    return {
        "median": _num(q50),
        "q25": _num(q25),
        "q75": _num(q75),
        "n": len(a),
        "reached": int(np.sum(np.isfinite(a))),
    }


def _num(v: float | None) -> float | None:
    return round(v, 5) if v is not None and math.isfinite(v) else None
