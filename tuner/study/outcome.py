"""Turn a trial's Result into what Optuna and the dashboard record.

Encoding (chosen so every sampler learns from every outcome; see optuna-facts items 1 and 6):
- timed routes are COMPLETE with the latency statistic as the value;
- routes that failed the quick accuracy gate, and routes that failed to build or run, are PRUNED
  (TPE learns from PRUNED trials; a bare FAIL is ignored by every sampler);
- every finished trial carries the same two constraints, in the same order: `accuracy`
  (violation relative to the tolerance) and `failure` (+1 when the route failed, -1 otherwise),
  through `Trial.set_constraint` and mirrored to the legacy `constraints` list the dashboard reads;
- interrupted and lost trials are FAIL, are not counted in the budget, and are re-queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner import job as J
from tuner.study.optuna_adapter import mirror_constraints

CONSTRAINT_KEYS = ("accuracy", "failure")
UNCOUNTED = tuple(sorted(J.outcomes("requeued")))  # FAIL, not counted in the budget, re-queued
FAILURES = J.outcomes("failed")  # PRUNED, counted: the route failed to build or run
GATE = J.outcomes("pruned")  # PRUNED, counted: the quick accuracy gate failed


@dataclass(frozen=True)
class Judgement:
    """How a result is recorded in Optuna."""

    state: TrialState
    value: float | None
    constraints: tuple[float, float]
    feasible: bool


def accuracy_violation(accuracy: float | None, tolerance: float) -> float:
    """(accuracy - tolerance) relative to the tolerance; <= 0 is within tolerance."""
    if accuracy is None or math.isnan(accuracy):
        return 0.0
    if math.isinf(accuracy):
        return 1e6
    return (accuracy - tolerance) / tolerance if tolerance > 0 else accuracy - tolerance


def judge(result: J.Result, tolerance: float, statistic: str) -> Judgement:
    """The state, objective value and constraints for a result."""
    if result.status in (J.OK, J.ACCURACY) and result.latency:
        acc = accuracy_violation(result.accuracy, tolerance)
        return Judgement(TrialState.COMPLETE, float(result.latency[statistic]), (acc, -1.0), acc <= 0)
    if result.status == J.GATE_FAILED:
        return Judgement(TrialState.PRUNED, None, (max(accuracy_violation(result.accuracy, tolerance), 1e-9), -1.0), False)
    if result.status in UNCOUNTED:
        return Judgement(TrialState.FAIL, None, (0.0, 1.0), False)
    return Judgement(TrialState.PRUNED, None, (0.0, 1.0), False)


def user_attrs(result: J.Result, metric: str, tolerance: float, extra: dict[str, Any]) -> dict[str, Any]:
    """The small per-trial attributes shown in the dashboard and read by `tuner best`/`report`."""
    attrs: dict[str, Any] = {
        "failure_class": "" if result.status == J.OK else result.status,
        "message": result.message[:500],
        "phase": result.phase,
        "accuracy": {"metric": metric, "value": _finite(result.accuracy), "tolerance": tolerance},
        **extra,
    }
    if result.latency:
        attrs["latency_ms"] = {k: round(float(v), 6) for k, v in result.latency.items()}
    if result.accuracy_per_output:
        attrs["accuracy_per_output"] = {k: _finite(v) for k, v in list(result.accuracy_per_output.items())[:20]}
    for key in ("build_s", "artifact_sha256", "artifact_bytes"):
        value = getattr(result, key)
        if value is not None:
            attrs[key] = value
    return attrs


def _finite(v: float | None) -> float | str | None:
    if v is None:
        return None
    return float(v) if math.isfinite(v) else str(v)


def record(study: optuna.Study, trial: optuna.Trial, result: J.Result, tolerance: float, statistic: str, attrs: dict[str, Any]) -> Judgement:
    """Write attributes and constraints, then tell Optuna how the trial ended."""
    j = judge(result, tolerance, statistic)
    for key, value in {**attrs, "feasible": j.feasible}.items():  # "feasible": the dashboard shows no constraints
        trial.set_user_attr(key, value)
    for key, value in zip(CONSTRAINT_KEYS, j.constraints):
        trial.set_constraint(key, value)
    mirror_constraints(study, trial, list(j.constraints))  # optuna-dashboard 0.21 only reads the legacy list
    if j.state == TrialState.COMPLETE:
        study.tell(trial, j.value)
    else:
        study.tell(trial, state=j.state)
    return j


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """COMPLETE with every constraint <= 0."""
    return trial.state == TrialState.COMPLETE and bool(trial.constraints) and all(v <= 0 for v in trial.constraints.values())
