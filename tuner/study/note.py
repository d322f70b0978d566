"""The study note shown in optuna-dashboard: the best *feasible* trial, its speedup, and how sure we are.

optuna-dashboard's own "best trial" ignores feasibility, so the tuner writes the answer into the study
note (Markdown, `optuna_dashboard.save_note`) after every trial and after the confirmation. The note
is the tuner's: edits made in the dashboard are overwritten by the next update.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import optuna

from tuner.study.summary import Summary, summarize_study

log = logging.getLogger("tuner.note")
NOTE_LIMIT = 2000  # one optuna-dashboard note chunk (2045 characters): written in one attribute


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def _best_line(s: Summary) -> str:
    if s.best is None:
        return "**Best feasible trial:** none yet (no route has been timed within the accuracy tolerance)."
    acc = s.best.user_attrs.get("accuracy") or {}
    accuracy = f"; {acc.get('metric')} {acc.get('value'):.3g} (tolerance {acc.get('tolerance'):g})" if isinstance(acc.get("value"), float) else ""
    return f"**Best feasible trial: #{s.best.number}**, latency {_ms(s.best_value)}{accuracy}."


def _speedup_line(s: Summary) -> str:
    if s.baseline is None:
        return "**Speedup over the default route:** the default route has not finished yet."
    if s.speedup is None:
        return f"**Speedup over the default route:** not available (the default route, trial #{s.baseline.number}, is not feasible)."
    return f"**Speedup over the default route** (trial #{s.baseline.number}, {_ms(s.baseline_value)}): **{s.speedup:.3f}x** as measured in the study."


def _confidence_line(s: Summary, confirmation: dict[str, Any] | None) -> str:
    if not confirmation:
        return ("**Confidence:** not confirmed yet: each route was timed once. When the budget is spent, `tuner run` "
                "re-measures the top candidates against the default in interleaved fresh processes and states an interval.")
    stale = ""
    if s.best is not None and confirmation.get("study_best_trial") != s.best.number:
        stale = f" (confirmed when the best trial was #{confirmation.get('study_best_trial')}; run `tuner run` again to re-confirm)"
    return f"**Confidence:** {confirmation.get('message', confirmation.get('verdict'))}{stale}."


def render_note(s: Summary, confirmation: dict[str, Any] | None, now: datetime | None = None) -> str:
    """The note's Markdown for a study summary and its confirmation document (if any)."""
    done = s.complete + s.pruned + s.failed
    classes = ", ".join(f"{k} {v}" for k, v in sorted(s.failure_classes.items())) or "none"
    lines = [
        f"## Route Tuner: {s.study}",
        _best_line(s),
        _speedup_line(s),
        _confidence_line(s, confirmation),
        f"**Trials:** {done} finished of budget {s.budget} (feasible {s.feasible}, infeasible {s.infeasible}, "
        f"failed {s.failed}), {s.running} running. Failure classes: {classes}.",
    ]
    if s.best is not None:
        route = ", ".join(f"{k}={v}" for k, v in s.best.params.items())
        lines.append(f"**Route of #{s.best.number}:** `{route[:600]}`")
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines.append(f"_Written by route-tuner at {stamp}; edits here are overwritten._")
    return "\n\n".join(lines)[:NOTE_LIMIT]


def update_note(study: optuna.Study) -> bool:
    """Rewrite the study note from the current trials. Never raises: a note is not worth a trial."""
    try:
        from optuna_dashboard import save_note

        save_note(study, render_note(summarize_study(study), study.user_attrs.get("confirmation")))
        return True
    except Exception as exc:  # the note is a convenience; the study must go on without it
        log.warning("could not update the study note: %s: %s", type(exc).__name__, exc)
        return False
