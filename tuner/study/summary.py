"""What a study has found so far: counts, the best feasible trial, the baseline, the speedup."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner import job as J
from tuner.study import attrs as A
from tuner.study.outcome import FAILURES, STOPPED_EARLY, UNCOUNTED, is_feasible, measured_latency


@dataclass
class Summary:
    """Counts and headline results of one study."""

    study: str
    budget: int | None
    complete: int
    pruned: int
    failed: int
    running: int
    waiting: int
    feasible: int
    infeasible: int
    requeued: int
    cache_hits: int
    best: FrozenTrial | None
    baseline: FrozenTrial | None
    elapsed_s: float
    failure_classes: dict[str, int]
    repeated_failures: int = 0
    confirm_s: float = 0.0  # the confirmation's time, counted in elapsed_s
    default_ms: float | None = None  # the default route as measured (median of its uncontended timings beside trials)

    @property
    def best_ms(self) -> float | None:
        """The best feasible trial's latency as its own uncontended timing measured it (not a scaled figure)."""
        return measured_latency(self.best) if self.best else None

    @property
    def best_default_ms(self) -> float | None:
        """The default route's latency as the best feasible trial's own timing measured it beside that trial."""
        return measured_latency(self.best, "default") if self.best else None

    @property
    def best_value(self) -> float | None:
        return self.best.value if self.best else None

    @property
    def baseline_value(self) -> float | None:
        return self.baseline.value if self.baseline and is_feasible(self.baseline) else None

    @property
    def speedup(self) -> float | None:
        if self.best_value and self.baseline_value:
            return self.baseline_value / self.best_value
        return None

    def status_json(self) -> dict:
        """The stable `tuner status --json` document (extra keys are additions, never renames)."""
        return {
            "study": self.study,
            "budget": self.budget,
            "complete": self.complete,
            "pruned": self.pruned,
            "failed": self.failed,
            "running": self.running,
            "waiting": self.waiting,
            "feasible": self.feasible,
            "best_value": self.best_value,
            "baseline_value": self.baseline_value,
            "infeasible": self.infeasible,
            "requeued": self.requeued,
            "cache_hits": self.cache_hits,
            "speedup": self.speedup,
            "best_trial": self.best.number if self.best else None,
            "elapsed_s": round(self.elapsed_s, 3),
            "confirm_s": round(self.confirm_s, 3),
            "failure_classes": self.failure_classes,
            "repeated_failures": self.repeated_failures,
            "repeated_failures_share": round(self.repeated_failures / self.budget, 4) if self.budget else None,
            "best_ms": self.best_ms,
            "best_default_ms": self.best_default_ms,
            "default_ms": self.default_ms,
        }


def failure_class(t: FrozenTrial) -> str:
    """A finished trial's failure class ('' for success)."""
    return str(t.user_attrs.get(A.FAILURE_CLASS, ""))


def repeated_failures(trials: list[FrozenTrial]) -> int:
    """Trials that used budget on a failure an earlier trial already showed (same `failure_key`).

    Known failures (no child ran, no budget used) are not counted: they are the point of learning.
    """
    seen: set[str] = set()
    repeated = 0
    for t in sorted(trials, key=lambda t: t.number):
        key = t.user_attrs.get(A.FAILURE_KEY)
        if not t.state.is_finished() or not key:
            continue
        if key in seen and failure_class(t) != J.KNOWN_FAILURE:
            repeated += 1
        seen.add(str(key))
    return repeated


def summarize_study(study: optuna.Study) -> Summary:
    """Summarise every trial of `study` (a fresh read)."""
    return summarize_trials(study.study_name, study.get_trials(deepcopy=False), study.user_attrs)


def summarize_trials(name: str, trials: Sequence[FrozenTrial], attrs: Mapping[str, Any]) -> Summary:
    """Summarise study `name` from its trials and its user attributes, read once by the caller."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    feasible = [t for t in complete if is_feasible(t)]
    classes: dict[str, int] = {}
    for t in trials:
        c = failure_class(t)
        if t.state.is_finished() and c:
            classes[c] = classes.get(c, 0) + 1
    failed = sum(1 for t in trials if t.state.is_finished() and failure_class(t) in FAILURES)
    stopped = sum(1 for t in trials if t.state == TrialState.PRUNED and failure_class(t) in STOPPED_EARLY)
    baselines = [t for t in trials if t.user_attrs.get(A.SOURCE) == "baseline" and t.state == TrialState.COMPLETE]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    running = any(t.state == TrialState.RUNNING for t in trials)
    elapsed = 0.0
    if starts:
        end = datetime.now() if running or not ends else max(ends)
        elapsed = (end - min(starts)).total_seconds()
    confirm_s = float((attrs.get(A.CONFIRMATION) or {}).get("seconds") or 0.0)
    return Summary(
        study=name,
        budget=attrs.get(A.BUDGET),
        complete=len(complete),
        pruned=stopped,
        failed=failed,
        running=sum(1 for t in trials if t.state == TrialState.RUNNING),
        waiting=sum(1 for t in trials if t.state == TrialState.WAITING),
        feasible=len(feasible),
        infeasible=len(complete) - len(feasible) + stopped - classes.get(J.SLOW, 0),  # slow routes are not infeasible
        requeued=sum(1 for t in trials if t.state == TrialState.FAIL and failure_class(t) in UNCOUNTED),
        cache_hits=sum(1 for t in trials if t.user_attrs.get(A.CACHE_HIT)),
        best=min(feasible, key=lambda t: (t.value, t.number)) if feasible else None,
        baseline=baselines[0] if baselines else None,
        elapsed_s=elapsed + confirm_s,
        confirm_s=confirm_s,
        failure_classes=classes,
        repeated_failures=repeated_failures(trials),
        default_ms=default_measured(complete),
    )


def default_measured(trials: list[FrozenTrial]) -> float | None:
    """The default route's latency as measured: the median of its uncontended timings (its own trial's, and beside each
    paired trial)."""
    values = sorted(float(m["default"]) for t in trials if "default" in (m := t.user_attrs.get(A.MEASURED_MS) or {}))
    return statistics.median(values) if values else None
