"""Paired trials in the study: what a trial is paired with, the incumbent, racing close leaders, "confirmed".

Trial user attributes (named in `tuner.study.attrs`; written by `tuner.study.outcome` and by racing
here; read by `tuner best`, the note and the report):

- `paired` (bool): the trial was timed paired with the baseline engine in one process (ABBA blocks).
  False for the baseline trial itself and for trials measured unpaired (`unpaired`: why).
- `speedup_paired` (float): baseline latency / candidate latency from that pairing (Hodges-Lehmann);
  1.0 for the baseline trial. `speedup_paired_ci` ([low, high]) its interval at
  `speedup_paired_confidence`.
- `timing_stop`: what ended the measurement: `precision` (interval within the target half-width),
  `cap` (the timing cap was spent first), `slow` (pruned: the interval lay below the incumbent's)
  or `ahead` (the interval lay above the incumbent's).
- `contended` (bool): other work on the host kept taking the cores the timing needed, so it had too
  few clean cycles (`tuner.measure.contention`); such a trial has no standing here (it is not the
  incumbent, not raced, not confirmed) until an uncontended re-measurement refines it.
- `timing` (dict): cycles, seconds, half-width, drift/repeat flags, warm-up, exclusive, load
  average and clocks before/after, baseline wait/load seconds, mode.
- `baseline_latency_ms` (dict): the baseline engine's latency statistics measured in this trial.
Racing results live in the *study* user attribute `racing` (Optuna refuses to change a finished
trial's attributes or value): `{"<trial number>": {...}}` with `speedup_refined`,
`speedup_refined_ci` (every paired measurement of the trial pooled: the original and each
re-measurement, as a random-effects combination, `tuner.measure.speedup.pooled_speedup`),
`value_refined` (the study value from the refined speedup), `remeasured` (how
many re-measurements), `confirmed` (bool, see `is_confirmed`) and, while a worker re-measures it,
`claim`. With `[[objective.shapes]]` it also has `shapes_refined` (`A.SHAPES_REFINED`): each shape's
cycles of the same measurements pooled the same way, shape by shape (`shape_pools`;
`tuner.measure.pooling.ShapePools.rows`: inputs, weight, `speedup`, `ci`, `confidence`, the median
`route_ms` and `default_ms`, and `measurements`, how many were pooled), which the verdict says for a
re-measured trial. Each re-measurement's samples are kept in `tuner_measurements` (kind `race`). Read it
with `races(study)`; the study's best is `best_confirmed(trials, races)`.

The value told to Optuna for a paired trial is `baseline value / speedup_paired`: the baseline
trial's own latency (the study-wide baseline latency) scaled by the paired ratio, so the sampler
sees milliseconds that are comparable across trials without the drift between them. A refined
value cannot be told to Optuna afterwards; the sampler keeps the first one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.measure.pooling import ShapePools
from tuner.measure.speedup import Speedup, pooled_speedup
from tuner.study import attrs as A
from tuner.study.outcome import is_feasible

BASELINE_SOURCE = "baseline"
Races = Mapping[str, Mapping[str, Any]]
CONFIDENCE = 0.95  # of the pooled interval (the trials' own intervals use the same level)
REMEASURE_MAX = 2  # re-measurements of one trial while racing
RACE_TOP_K = 3  # leaders considered for racing


def races(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """The study's racing document (trial number as a string -> refined standing)."""
    return races_in(study.user_attrs)


def races_in(attrs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The racing document in a study's user attributes `attrs` (read by the caller)."""
    return dict(attrs.get(A.RACING) or {})


def is_baseline(t: FrozenTrial) -> bool:
    """The trial of the study's default route (enqueued first)."""
    return t.user_attrs.get(A.SOURCE) == BASELINE_SOURCE


def baseline_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The completed baseline trial, if any."""
    return next((t for t in trials if is_baseline(t) and t.state == TrialState.COMPLETE), None)


def baseline_pending(trials: Sequence[FrozenTrial]) -> bool:
    """A baseline trial is waiting or running (no completed one yet)."""
    return baseline_trial(trials) is None and any(is_baseline(t) and not t.state.is_finished() for t in trials)


@dataclass(frozen=True)
class Standing:
    """A feasible paired trial's current speedup (refined where it was re-measured)."""

    number: int
    estimate: float
    low: float
    high: float
    remeasured: int


def standing(t: FrozenTrial, raced: Races) -> Standing | None:
    """The trial's standing (refined where it was re-measured), or None when it has no paired speedup or is not
    feasible."""
    if not is_feasible(t) or is_baseline(t) or not t.user_attrs.get(A.PAIRED):
        return None
    r = raced.get(str(t.number)) or {}
    if "speedup_refined" not in r and t.user_attrs.get(A.CONTENDED):
        return None
    if "speedup_refined" in r:
        est, (low, high) = r["speedup_refined"], r["speedup_refined_ci"]
    else:
        est, (low, high) = t.user_attrs[A.SPEEDUP_PAIRED], t.user_attrs[A.SPEEDUP_PAIRED_CI]
    return Standing(t.number, float(est), float(low), float(high), int(r.get("remeasured", 0)))


def standings(trials: Sequence[FrozenTrial], raced: Races) -> list[Standing]:
    """Every feasible paired trial's standing, fastest first."""
    out = [s for s in (standing(t, raced) for t in trials) if s is not None]
    return sorted(out, key=lambda s: (-s.estimate, s.number))


def refined_value(t: FrozenTrial, raced: Races, value: float | None = None) -> float | None:
    """The trial's value as racing left it: its refined value where it was re-measured, else `value` (default: the
    trial's own)."""
    return (raced.get(str(t.number)) or {}).get("value_refined", t.value if value is None else value)


def to_race(ranked: Sequence[Standing], top_k: int = RACE_TOP_K, max_remeasure: int = REMEASURE_MAX) -> list[int]:
    """The trials to re-measure now: the leader if it was never re-measured, and leaders whose intervals overlap the
    leader's.

    Among the `top_k` fastest, those overlapping the leader's interval (and the leader itself, when
    any overlap) are re-measured until each has had `max_remeasure` re-measurements.
    """
    if not ranked:
        return []
    leader, rest = ranked[0], list(ranked[1:top_k])
    close = [s for s in rest if overlap(s, leader)]
    picked = [leader] if close or leader.remeasured == 0 else []
    return [s.number for s in picked + close if s.remeasured < max_remeasure]


def overlap(a: Standing, b: Standing) -> bool:
    """Whether the two standings' intervals overlap: the measurements cannot yet tell the two routes apart."""
    return a.high >= b.low and b.high >= a.low


def is_confirmed(s: Standing) -> bool:
    """Re-measured at least once, and the pooled interval lies entirely above 1 (faster than the default)."""
    return s.remeasured >= 1 and s.low > 1.0


def best_confirmed(trials: Sequence[FrozenTrial], raced: Races) -> FrozenTrial | None:
    """The study's best: the fastest confirmed trial (by pooled speedup), or None."""
    by_number = {t.number: t for t in trials}
    confirmed = [s for s in standings(trials, raced) if is_confirmed(s)]
    return by_number[confirmed[0].number] if confirmed else None


def incumbent(trials: Sequence[FrozenTrial], raced: Races) -> float:
    """The speedup a new candidate's interval must reach not to be stopped as slow.

    The largest lower interval bound among the feasible paired trials (refined where available), at
    least 1.0 (the default route): a candidate is pruned only when its whole interval lies below an
    interval that is already known, i.e. the two do not overlap.
    """
    return max([1.0] + [s.low for s in standings(trials, raced)])


def incumbent_high(trials: Sequence[FrozenTrial], raced: Races) -> float:
    """The upper bound of the incumbent's interval (1.0 when the default route is the incumbent): a candidate whose
    interval lies entirely above it is a new leader, and its timing stops there (`ahead`)."""
    best = max(standings(trials, raced), key=lambda s: s.low, default=None)
    return best.high if best is not None and best.low > 1.0 else 1.0


def refine(measurements: Sequence[Sequence[float]], confidence: float) -> Speedup:
    """The pooled speedup of every paired measurement of one trial (each its per-cycle log ratios; random effects)."""
    return pooled_speedup(measurements, confidence)


def shape_pools(paired: Sequence[Mapping[str, Any]]) -> ShapePools:
    """Each shape's figures of a trial's paired measurements (each a kept measurement's `paired` stats, see
    `tuner.worker.jobs.measurement_stats`), shape by shape; empty without `[[objective.shapes]]`."""
    pools = ShapePools()
    for p in paired:
        if p.get("shapes"):
            pools.add(p["shapes"])
    return pools


def after_remeasure(
    entry: Mapping[str, Any],
    measurements: Sequence[Sequence[float]],
    failure: str | None,
    baseline_value: float | None,
    contended: bool = False,
    shapes: ShapePools | None = None,
) -> dict[str, Any]:
    """The change to a trial's racing entry after one re-measurement (its claim released).

    `measurements` are the per-cycle log ratios of every uncontended paired measurement of the trial,
    the new one included, and `shapes` the same measurements' per-shape figures (`shape_pools`);
    `failure` says why the re-measurement gave none (the trial then races no more); a `contended` one
    spends a re-measurement and refines nothing.
    """
    change: dict[str, Any] = {"claim": None}
    if contended:
        change["contended"] = int(entry.get("contended", 0)) + 1
    elif failure is None:
        change.update(
            refined_attrs(
                refine(measurements, CONFIDENCE),
                int(entry.get("remeasured", 0)) + 1,
                baseline_value,
                shapes.rows(CONFIDENCE, few=False) if shapes else None,
            )
        )
    else:
        change.update(remeasured=REMEASURE_MAX, race_failure=failure[:300])
    return change


def refined_attrs(
    pooled: Speedup, remeasured: int, baseline_value: float | None, shapes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The racing attributes of a trial after a re-measurement (`shapes`: each shape's pooled row, if any)."""
    s = Standing(-1, pooled.estimate, pooled.low, pooled.high, remeasured)
    attrs: dict[str, Any] = {
        "speedup_refined": pooled.estimate,
        "speedup_refined_ci": [pooled.low, pooled.high],
        "remeasured": remeasured,
        "confirmed": is_confirmed(s),
    }
    if baseline_value and math.isfinite(pooled.estimate) and pooled.estimate > 0:
        attrs["value_refined"] = baseline_value / pooled.estimate
    if shapes:
        attrs[A.SHAPES_REFINED] = shapes
    return attrs
