"""Turn a trial's Result into what Optuna and the dashboard record.

Encoding (chosen so every sampler learns from every outcome; see optuna-facts items 1 and 6):
- timed routes are COMPLETE; the value is the baseline trial's latency / the trial's paired speedup
  where it was timed paired with the baseline (`tuner.study.racing` lists the attributes), else the
  latency statistic itself;
- routes stopped as `slow` during timing (their paired interval lay below the incumbent) are PRUNED,
  with their running paired estimate reported as intermediate values (as `trial.report` would, in
  the same units as the value), which TPE ranks pruned trials by;
- routes that failed the quick accuracy gate, and routes that failed to build or run, are PRUNED
  (TPE learns from PRUNED trials; a bare FAIL is ignored by every sampler);
- every finished trial carries the same constraints, in the same order: `accuracy` (violation
  relative to the tolerance) and `failure` (+1 when the route failed, -1 otherwise), and, in a study
  with `[objective] max_memory_mb`, `memory` (the engine's peak memory over the cap, relative to
  it); as `Trial.set_constraint` stores them and mirrored to the legacy `constraints` list the dashboard reads;
- interrupted and lost trials are FAIL, are not counted in the budget, and are re-queued;
- known failures (a route needing a product that already failed to build) are PRUNED like any
  failure, so the sampler learns from them, but cost no child and no budget (see `budget`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import job as J
from tuner.store.leases import Fence
from tuner.study import attrs as A
from tuner.study.optuna_adapter import settle_trial

CONSTRAINT_KEYS = ("accuracy", "failure", "memory")  # "memory" only in a study with a memory cap
UNCOUNTED = tuple(sorted(J.outcomes("requeued")))  # FAIL, not counted in the budget, re-queued
FAILURES = J.outcomes("failed")  # PRUNED, counted: the route failed to build or run
STOPPED_EARLY = J.outcomes("pruned")  # PRUNED, counted: failed the quick accuracy gate, or slower than the incumbent


@dataclass(frozen=True)
class Judgement:
    """How a result is recorded in Optuna."""

    state: TrialState
    value: float | None
    constraints: tuple[float, ...]
    feasible: bool


def accuracy_violation(accuracy: float | None, tolerance: float) -> float:
    """(accuracy - tolerance) relative to the tolerance; <= 0 is within tolerance."""
    if accuracy is None or math.isnan(accuracy):
        return 0.0
    if math.isinf(accuracy):
        return 1e6
    return (accuracy - tolerance) / tolerance if tolerance > 0 else accuracy - tolerance


MAX_REPORTS = 20  # intermediate values reported per trial (the last cycle always among them)


def paired_speedup(result: J.Result) -> float | None:
    """The trial's paired speedup over the baseline engine, if it was timed paired."""
    value = result.paired.get("speedup") if result.paired.get("paired") else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def study_value(result: J.Result, statistic: str, baseline_value: float | None) -> float:
    """The value told to Optuna: baseline latency / paired speedup, else the measured latency statistic."""
    speedup = paired_speedup(result)
    if speedup is not None and baseline_value:
        return baseline_value / speedup
    return float(result.latency[statistic]) if result.latency else math.nan


def memory_violation(peak_mb: float | None, cap_mb: float) -> float:
    """(peak - cap) relative to the cap; <= 0 is within it (an unknown peak is not held against a route)."""
    return 0.0 if peak_mb is None else (peak_mb - cap_mb) / cap_mb


def judge(
    result: J.Result,
    tolerance: float,
    statistic: str,
    baseline_value: float | None = None,
    max_memory_mb: float | None = None,
) -> Judgement:
    """The state, objective value and constraints for a result (`memory` only with a memory cap)."""

    def constraints(acc: float, failure: float) -> tuple[float, ...]:
        if max_memory_mb is None:
            return acc, failure
        return acc, failure, (0.0 if failure > 0 else memory_violation(result.peak_memory_mb, max_memory_mb))

    if result.status in (J.OK, J.ACCURACY) and result.latency:
        timed = constraints(accuracy_violation(result.accuracy, tolerance), -1.0)
        return Judgement(
            TrialState.COMPLETE, study_value(result, statistic, baseline_value), timed, all(v <= 0 for v in timed)
        )
    if result.status == J.SLOW:
        return Judgement(
            TrialState.PRUNED, None, constraints(accuracy_violation(result.accuracy, tolerance), -1.0), False
        )
    if result.status == J.GATE_FAILED:
        return Judgement(
            TrialState.PRUNED, None, constraints(max(accuracy_violation(result.accuracy, tolerance), 1e-9), -1.0), False
        )
    if result.status in UNCOUNTED:
        return Judgement(TrialState.FAIL, None, constraints(0.0, 1.0), False)
    return Judgement(TrialState.PRUNED, None, constraints(0.0, 1.0), False)


def user_attrs(result: J.Result, metric: str, tolerance: float, extra: dict[str, Any]) -> dict[str, Any]:
    """The small per-trial attributes shown in the dashboard and read by `tuner best`/`report`."""
    attrs: dict[str, Any] = {
        A.FAILURE_CLASS: "" if result.status == J.OK else result.status,
        A.MESSAGE: result.message[:500],
        A.PHASE: result.phase,
        A.ACCURACY: {"metric": metric, "value": _finite(result.accuracy), "tolerance": tolerance},
        **extra,
    }
    if result.latency:
        attrs[A.LATENCY_MS] = {k: round(float(v), 6) for k, v in result.latency.items()}
    if result.paired:
        attrs.update(paired_attrs(result))
    if result.accuracy_per_output:
        attrs[A.ACCURACY_PER_OUTPUT] = {k: _finite(v) for k, v in list(result.accuracy_per_output.items())[:20]}
    if result.phase_s:
        attrs[A.PHASE_S] = {k: round(float(v), 4) for k, v in result.phase_s.items()}
    for key in (A.BUILD_S, A.ARTIFACT_SHA256, A.ARTIFACT_BYTES, A.PEAK_MEMORY_MB):  # as the Result's fields
        value = getattr(result, key)
        if value is not None:
            attrs[key] = value
    if result.memory_kind:
        attrs[A.MEMORY_KIND] = result.memory_kind
    if result.build_info:
        attrs[A.BUILD_INFO] = result.build_info
    return attrs


def paired_attrs(result: J.Result) -> dict[str, Any]:
    """The paired-timing attributes (names documented in `tuner.study.racing`)."""
    p = result.paired
    timing = {
        k: p[k]
        for k in (
            "cycles",
            "seconds",
            "halfwidth",
            "drift",
            "repeated",
            "steady",
            "warmup",
            "attempts",
            "level_ms",
            "baseline_trial",
            "baseline_wait_s",
            "baseline_load_s",
        )
        if k in p
    }
    info = result.timing_info
    timing.update(
        {
            k: info[k]
            for k in (
                "exclusive",
                "device",
                "lock_wait_s",
                "loadavg_before",
                "loadavg_after",
                "clocks_before",
                "clocks_after",
                "mode",
                "priority",
            )
            if k in info
        }
    )
    timing.update({k: p[k] for k in ("contended_cycles", "contention") if k in p})
    attrs: dict[str, Any] = {
        A.PAIRED: bool(p.get("paired")),
        A.TIMING_STOP: p.get("stop", ""),
        A.TIMING: timing,
        A.CONTENDED: bool(p.get("contended")),
    }
    if p.get("shapes"):  # [[objective.shapes]]: each shape's own figures (its cycles stay with the measurement)
        attrs[A.SHAPES] = [{k: v for k, v in e.items() if k != "log_ratios"} for e in p["shapes"]]
    if "affinity" in info:
        attrs[A.AFFINITY] = info["affinity"]
    if p.get("paired"):
        attrs.update(
            {
                A.SPEEDUP_PAIRED: p["speedup"],
                A.SPEEDUP_PAIRED_CI: list(p["ci"]),
                A.SPEEDUP_PAIRED_CONFIDENCE: p.get("confidence"),
            }
        )
        if p.get("baseline_latency"):
            attrs[A.BASELINE_LATENCY_MS] = {k: round(float(v), 6) for k, v in p["baseline_latency"].items()}
    else:
        attrs[A.UNPAIRED] = p.get("unpaired", "")
        if p.get("role") == "baseline":
            attrs[A.SPEEDUP_PAIRED], attrs[A.SPEEDUP_PAIRED_CI] = 1.0, [1.0, 1.0]
    return attrs


def measured_ms(result: J.Result, statistic: str) -> dict[str, float]:
    """The latencies this trial's own timing measured, when other work did not contend it: {"trial", "default"} in ms.

    What `tuner run`, `best` and the note show as milliseconds (never the baseline trial's figure
    scaled by a ratio); "default" is the baseline engine timed beside the candidate in the same process.
    """
    if not result.latency or statistic not in result.latency or result.paired.get("contended"):
        return {}
    out = {"trial": round(float(result.latency[statistic]), 6)}
    default = (result.paired.get("baseline_latency") or {}).get(statistic) if result.paired.get("paired") else None
    if default is not None:
        out["default"] = round(float(default), 6)
    elif result.paired.get("role") == "baseline":
        out["default"] = out["trial"]
    return out


def measured_latency(trial: FrozenTrial, engine: str = "trial") -> float | None:
    """The latency in ms of the trial's engine (`engine="trial"`) or of the default's timed beside it (`"default"`) as
    the trial's own uncontended timing measured it (`measured_ms`), or None: what is shown as a trial's milliseconds."""
    value = (trial.user_attrs.get(A.MEASURED_MS) or {}).get(engine)
    return None if value is None else float(value)


def intermediate_values(result: J.Result, baseline_value: float | None) -> dict[int, float]:
    """The running paired estimate as intermediate values {cycle: value}, in the value's units (at most MAX_REPORTS)."""
    running = result.paired.get("running") or []
    if not running or not baseline_value:
        return {}
    step = max(1, math.ceil(len(running) / MAX_REPORTS))
    return {int(cycle): baseline_value / float(estimate) for cycle, estimate, *_ in running[::-1][::step][::-1]}


def _finite(v: float | None) -> float | str | None:
    if v is None:
        return None
    return float(v) if math.isfinite(v) else str(v)


def record(
    study: optuna.Study,
    trial: optuna.Trial,
    result: J.Result,
    tolerance: float,
    statistic: str,
    attrs: dict[str, Any],
    baseline_value: float | None = None,
    max_memory_mb: float | None = None,
    fence: Fence | None = None,
) -> Judgement:
    """Write attributes, constraints, intermediate values and how the trial ended, in one transaction.

    `baseline_value` is the baseline trial's value (the study-wide baseline latency), when known;
    `max_memory_mb` the study's memory cap, when it has one; `fence` the worker's lease on the
    trial (`tuner.store.leases.LeaseLost` if it was reaped meanwhile: nothing is written).
    """
    j = judge(result, tolerance, statistic, baseline_value, max_memory_mb)
    measured = measured_ms(result, statistic)
    settle_trial(
        study,
        trial,
        j.state,
        j.value,
        {**attrs, A.FEASIBLE: j.feasible, **({A.MEASURED_MS: measured} if measured else {})},
        dict(zip(CONSTRAINT_KEYS, j.constraints)),
        intermediate_values(result, baseline_value),
        fence,
    )
    return j


def is_feasible(trial: optuna.trial.FrozenTrial) -> bool:
    """COMPLETE with every constraint <= 0."""
    return (
        trial.state == TrialState.COMPLETE
        and bool(trial.constraints)
        and all(v <= 0 for v in trial.constraints.values())
    )
