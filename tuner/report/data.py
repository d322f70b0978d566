"""What a study report shows, read once from the study, the tuner's tables and the study file."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.store.cache import ResultStore
from tuner.store.models import Measurement
from tuner.study import attrs as A
from tuner.study.documents import timed_headline
from tuner.study.outcome import is_feasible, measured_latency
from tuner.study.racing import Races, races
from tuner.study.setup import Context
from tuner.study.summary import Summary, failure_class
from tuner.study.verdict import Estimate, Headline, study_estimate

MIN_IMPORTANCE_TRIALS = 4  # fewer feasible trials say nothing about which knob matters


@dataclass
class TrialRow:
    """One finished trial as the report needs it."""

    number: int
    state: str
    value: float | None
    feasible: bool
    outcome: str  # "feasible", "infeasible" (timed but over tolerance) or the failure class
    accuracy: float | None
    params: dict[str, Any]
    cache_key: str
    speedup: Estimate | None = None  # the study's own estimate vs the default route (paired where measured so)
    artifact_bytes: int | None = None  # the engine file's size
    peak_memory_mb: float | None = (
        None  # what loading and running the engine added at its highest (tuner.measure.memory)
    )
    latency_ms: float | None = None  # as the trial's own uncontended timing measured it (`measured_latency`)


@dataclass
class ReportData:
    """Everything the plots and the HTML page are drawn from."""

    study: str
    statistic: str
    metric: str
    tolerance: float
    summary: Summary
    trials: list[TrialRow]
    confirmation: dict[str, Any] | None
    samples: dict[str, list[float]] = field(default_factory=dict)  # "default"/"contender" -> raw latency samples (ms)
    samples_kind: str = "trial"  # "confirm" when they come from the confirmation rounds
    contender: int | None = (
        None  # the trial compared with the default: confirmed winner, best candidate or best feasible
    )
    contender_role: str = "best feasible"
    importances: dict[str, float] = field(default_factory=dict)
    importance_note: str = ""
    headline: Headline | None = None  # the study's one conclusion (`tuner.study.verdict`)
    max_memory_mb: float | None = None  # the study's memory cap ([objective] max_memory_mb)


def _float(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _row(t: FrozenTrial, baseline: FrozenTrial | None, raced: Races) -> TrialRow:
    feasible = is_feasible(t)
    cls = failure_class(t)
    outcome = (
        "feasible" if feasible else ("infeasible" if t.state == TrialState.COMPLETE else cls or t.state.name.lower())
    )
    return TrialRow(
        t.number,
        t.state.name,
        t.value if t.state == TrialState.COMPLETE else None,
        feasible,
        outcome,
        _float((t.user_attrs.get(A.ACCURACY) or {}).get("value")),
        dict(t.params),
        str(t.user_attrs.get(A.CACHE_KEY, "")),
        study_estimate(t, baseline, raced) if feasible else None,
        t.user_attrs.get(A.ARTIFACT_BYTES),
        _float(t.user_attrs.get(A.PEAK_MEMORY_MB)),
        measured_latency(t),
    )


def importances(trials: list[FrozenTrial]) -> tuple[dict[str, float], str]:
    """Parameter importances over the feasible COMPLETE trials, or ({}, why not)."""
    feasible = [t for t in trials if is_feasible(t)]
    varied = sorted(
        {name for t in feasible for name in t.params if len({str(u.params.get(name)) for u in feasible}) > 1}
    )
    if len(feasible) < MIN_IMPORTANCE_TRIALS or not varied:
        why = (
            f"{len(feasible)} feasible trial(s)"
            if len(feasible) < MIN_IMPORTANCE_TRIALS
            else "no parameter varies among the feasible trials"
        )
        return (
            {},
            f"not enough data for parameter importance: {why} (need {MIN_IMPORTANCE_TRIALS} with a varying parameter)",
        )
    copy = optuna.create_study(direction="minimize")
    copy.add_trials(feasible)
    return optuna.importance.get_param_importances(copy, params=varied), ""


def _samples(measurements: list[Measurement], trial: TrialRow | None, kind: str, number: int | None) -> list[float]:
    """Raw samples of one route: confirmation runs by trial number, study runs by cache key."""
    if trial is None:
        return []
    if kind == "confirm":
        picked = [m for m in measurements if m.kind == "confirm" and m.trial_number == number]
    else:
        picked = [
            m
            for m in measurements
            if m.kind == "trial" and trial.cache_key and m.result_key.startswith(trial.cache_key)
        ][:1]
    return [float(s) for m in picked for s in m.samples_ms]


def _latest_confirm_run(measurements: list[Measurement]) -> list[Measurement]:
    confirms = [m for m in measurements if m.kind == "confirm"]
    return [m for m in confirms if m.result_key == confirms[-1].result_key] if confirms else []


def collect(ctx: Context, study: optuna.Study) -> ReportData:
    """Read the study for a report."""
    frozen = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    summary, headline = timed_headline(ctx, study)
    confirmation = study.user_attrs.get(A.CONFIRMATION)
    raced = races(study)
    rows = [_row(t, summary.baseline, raced) for t in frozen]
    by_number = {r.number: r for r in rows}
    conf = confirmation or {}
    contender = conf["trial"] if conf.get("trial") is not None else (summary.best.number if summary.best else None)
    role = (
        "winner"
        if conf.get("winner_trial") is not None
        else "best candidate"
        if conf.get("trial") is not None
        else "best feasible"
    )
    baseline = summary.baseline.number if summary.baseline else None
    measurements = ResultStore(ctx.url).measurements(ctx.spec.study)
    confirm_run = _latest_confirm_run(measurements)
    confirmed = {m.trial_number for m in confirm_run}
    kind = "confirm" if baseline in confirmed and contender in confirmed else "trial"
    pool = confirm_run if kind == "confirm" else measurements
    data = ReportData(
        study=ctx.spec.study,
        statistic=ctx.spec.objective.statistic,
        metric=ctx.spec.accuracy.metric,
        tolerance=ctx.spec.accuracy.tolerance,
        summary=summary,
        trials=rows,
        confirmation=confirmation,
        samples_kind=kind,
        contender=contender,
        contender_role=role,
        headline=headline,
        max_memory_mb=ctx.spec.objective.max_memory_mb,
    )
    data.samples = {
        "default": _samples(pool, by_number.get(baseline) if baseline is not None else None, kind, baseline),
        "contender": _samples(pool, by_number.get(contender) if contender is not None else None, kind, contender),
    }
    data.importances, data.importance_note = importances(frozen)
    return data
