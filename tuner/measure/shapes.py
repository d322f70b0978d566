"""One trial measured at several input shapes (`[[objective.shapes]]`): the per-shape paired measurements combined.

Each shape is its own paired measurement (`tuner.measure.paired.measure_paired`, the same ABBA blocks,
the same policy) on one feed of that shape. The trial's speedup is the weighted geometric mean of the
per-shape speedups, its interval combined from theirs (`tuner.measure.speedup.weighted_speedup`); its
latencies (and the default's) are the weighted geometric means of the per-shape statistics, so the
study value (baseline latency / speedup) keeps its meaning. Its `log_ratios` are mixed cycles
(`mixed_cycles`), which racing and the confirmation pool as one shape's cycles. The samples kept are
the heaviest shape's. Each shape's own figures are kept in `shapes`; `per_shape` says them in one line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuner.measure.paired import CAP, PairedResult
from tuner.measure.speedup import mixed_cycles, weighted_speedup
from tuner.measure.timing import summarize
from tuner.spec.shapes import shape_label


def heaviest(weights: Sequence[float]) -> int:
    """The index of the heaviest-weighted shape (the first of equals)."""
    return max(range(len(weights)), key=lambda i: (weights[i], -i))


def weighted_latency(latencies: Sequence[Mapping[str, float]], weights: Sequence[float]) -> dict[str, float]:
    """Each latency statistic's weighted geometric mean over the shapes."""
    total = float(sum(weights))
    keys = set.intersection(*(set(x) for x in latencies))
    return {
        k: math.exp(sum(w * math.log(max(float(x[k]), 1e-12)) for x, w in zip(latencies, weights)) / total)
        for k in sorted(keys)
    }


def shape_entry(inputs: Mapping[str, Any], weight: float, r: PairedResult, statistic: str) -> dict[str, Any]:
    """What one shape's measurement keeps: its inputs, weight, both engines' statistic, speedup and interval."""
    out: dict[str, Any] = {
        "inputs": {k: list(v) for k, v in inputs.items()},
        "weight": weight,
        "route_ms": summarize(r.candidate_samples).to_dict()[statistic],
        "stop": r.stop,
        "cycles": r.cycles,
        "contended": r.contended,
        "log_ratios": [round(d, 6) for d in r.log_ratios],
    }
    if r.speedup is not None:
        out.update(
            default_ms=summarize(r.baseline_samples).to_dict()[statistic],
            speedup=r.speedup.estimate,
            ci=[r.speedup.low, r.speedup.high],
        )
    return out


def per_shape(entries: Sequence[Mapping[str, Any]]) -> str:
    """Each shape's speedup and interval in one line ("images 1x3x224x224 1.21x [1.10-1.33], ..."), from entries
    with `inputs`, `speedup` and `ci` (a trial's, the confirmation's); "" unless there are several shapes, some
    with a speedup."""
    if len(entries) < 2 or all(e.get("speedup") is None for e in entries):
        return ""

    def one(e: Mapping[str, Any]) -> str:
        if e.get("speedup") is None or not e.get("ci"):
            return f"{shape_label(e['inputs'])} not timed paired"
        low, high = e["ci"]
        return f"{shape_label(e['inputs'])} {e['speedup']:.2f}x [{low:.2f}-{high:.2f}]"

    return ", ".join(one(e) for e in entries)


def combined_summary(results: Sequence[PairedResult], weights: Sequence[float]) -> dict[str, Any]:
    """The trial-level summary of per-shape measurements (`PairedResult.summary`'s keys)."""
    top = results[heaviest(weights)]
    paired = all(r.speedup is not None for r in results)
    out: dict[str, Any] = {
        **top.summary(),
        "stop": CAP if any(r.stop == CAP for r in results) else top.stop,
        "seconds": round(sum(r.seconds for r in results), 4),
        "drift": any(r.drift for r in results),
        "repeated": any(r.repeated for r in results),
        "steady": all(r.steady for r in results),
        "attempts": [a for r in results for a in r.attempts],
        "contended": any(r.contended for r in results),
        "contended_cycles": sum(r.contended_cycles for r in results),
        "level_ms": [
            round(math.exp(sum(w * math.log(r.level_ms[k]) for r, w in zip(results, weights)) / sum(weights)), 6)
            for k in range(3)
        ],
    }
    if paired:
        s = weighted_speedup([r.speedup for r in results if r.speedup is not None], weights)
        mixed = mixed_cycles([r.log_ratios for r in results], weights)
        out.update(speedup=s.estimate, ci=[s.low, s.high], confidence=s.confidence, halfwidth=round(s.halfwidth, 5))
        out["cycles"] = len(mixed)
        out["log_ratios"] = [round(d, 6) for d in mixed]
    else:
        out["log_ratios"] = []
    return out
